"""A fault-injecting HTTP proxy on loopback in front of an S3 API server (moto), for the fault
tests and the fault benchmark (ADR 0045). It forwards each request and returns the server's
answer, except that a seeded share of requests meets one of the faults production brings:

- `slow_down`: 503 with S3's `SlowDown` error, not forwarded;
- `internal_error`: 500 with S3's `InternalError`, not forwarded;
- `reset_before`: the connection reset (RST) before forwarding: the request never took effect;
- `reset_after`: forwarded (it took effect), then the connection reset before the answer;
- `truncate`: forwarded, then the answer's headers with half its body, and the connection closed;
- `delay`: forwarded after `delay_seconds`.

One request per connection (`Connection: close`). The faults drawn depend only on the seed and
the order requests arrive in; `max_faults` bounds them, and `enabled` switches them off. A
`schedule` (request number, 1-based in arrival order, to kind) replaces the draw, for tests that
choose each fault; `on_request(number)` is called before each request is handled (a test's hook
for faults outside the store, such as killing the writer's PostgreSQL sessions at that moment).
"""

from __future__ import annotations

import http.client
import multiprocessing
import random
import socket
import socketserver
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from urllib.parse import urlparse

KINDS = ("slow_down", "internal_error", "reset_before", "reset_after", "truncate", "delay")
_ERROR = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message>'
    b"<RequestId>oml-fault</RequestId></Error>"
)
_CANNED = {
    "slow_down": (503, "Slow Down", b"SlowDown", b"Please reduce your request rate."),
    "internal_error": (500, "Internal Server Error", b"InternalError", b"We encountered an error."),
}
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "proxy-connection",
}


class FaultProxy:
    """The proxy as a context manager; `endpoint` is what clients use as AWS_ENDPOINT_URL.

        It serves from a process of its own: a drain in the test's own process holds the GIL while
        delta-rs reads a table through its QueryBuilder (bench/RESULTS.md, 6 Dec), and a proxy
        thread beside it then cannot answer the very requests that read waits on (each one timed out
        after object_store's 30 s). `on_request` must therefore be picklable (a module-level
        function or an instance of a module-level class); `requests`, `injected` and `enabled` are
        shared with that process.

    `port` fixes the proxy's port (0: a free one). `outage` plays the store's endpoint down, as while
    its server restarts: every connection is reset at once, nothing is forwarded, until it is
    switched off again (the chaos soak; moto keeps its objects in memory, so restarting moto itself
    would lose them)."""

    def __init__(
        self,
        upstream: str,
        *,
        rate: float = 0.1,
        seed: int = 0,
        kinds: tuple[str, ...] = KINDS,
        delay_seconds: float = 2.0,
        max_faults: int = 10_000,
        timeout: float = 60.0,
        schedule: Mapping[int, str] | None = None,
        on_request: Callable[[int], None] | None = None,
        port: int = 0,
    ):
        unknown = (set(kinds) | set((schedule or {}).values())) - set(KINDS)
        if unknown or not kinds:
            raise ValueError(f"fault kinds must be some of {KINDS}, got {sorted(unknown)}")
        target = urlparse(upstream)
        self._config = {
            "upstream": (target.hostname or "127.0.0.1", target.port or 80),
            "rate": rate,
            "seed": seed,
            "kinds": tuple(kinds),
            "delay_seconds": delay_seconds,
            "max_faults": max_faults,
            "timeout": timeout,
            "schedule": dict(schedule) if schedule is not None else None,
            "on_request": on_request,
            "port": port,
        }
        context = multiprocessing.get_context("spawn")
        self._context = context
        self._requests = context.Value("q", 0)
        self._injected = context.Array("q", len(KINDS))
        self._enabled = context.Value("b", 1)
        self._outage = context.Value("b", 0)
        self._stop = context.Event()
        self._process: multiprocessing.process.BaseProcess | None = None
        self.endpoint = ""

    @property
    def requests(self) -> int:
        return self._requests.value

    @property
    def injected(self) -> Counter[str]:
        return Counter({k: n for k, n in zip(KINDS, self._injected[:], strict=True) if n})

    @property
    def enabled(self) -> bool:
        return bool(self._enabled.value)

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self._enabled.value = 1 if on else 0

    @property
    def outage(self) -> bool:
        return bool(self._outage.value)

    @outage.setter
    def outage(self, on: bool) -> None:
        self._outage.value = 1 if on else 0

    def __enter__(self) -> FaultProxy:
        ready, told = self._context.Pipe(duplex=False)
        shared = (self._requests, self._injected, self._enabled, self._stop, self._outage)
        process = self._context.Process(
            target=_serve_forever, args=(self._config, shared, told), daemon=True
        )
        self._process = process
        process.start()
        if not ready.poll(START_TIMEOUT_S):
            process.kill()
            raise RuntimeError(f"the fault proxy did not start within {START_TIMEOUT_S}s")
        self.endpoint = f"http://127.0.0.1:{ready.recv()}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._process is None:
            return
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)


START_TIMEOUT_S = 30.0


def _serve_forever(config: dict, shared: tuple, told) -> None:
    """The proxy's process: serve until the parent sets the stop event."""
    requests, injected, enabled, stop, outage = shared
    server = _Proxy(config, requests, injected, enabled, outage=outage)
    told.send(server.port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stop.wait()
    server.shutdown()


class _Proxy:
    """The proxy's own process: a thread per connection, one request per connection."""

    def __init__(self, config: dict, requests, injected, enabled, outage=None):
        self.upstream: tuple[str, int] = config["upstream"]
        self.rate, self.kinds = config["rate"], config["kinds"]
        self.delay_seconds, self.timeout = config["delay_seconds"], config["timeout"]
        self.max_faults, self.schedule = config["max_faults"], config["schedule"]
        self.on_request = config["on_request"]
        self._requests, self._injected, self._enabled = requests, injected, enabled
        self._outage = outage
        self._rng = random.Random(config["seed"])
        self._lock = threading.Lock()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 128

        self._server = Server(("127.0.0.1", config.get("port", 0)), Handler)
        self.port = self._server.server_address[1]

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _draw(self) -> str | None:
        with self._lock:
            self._requests.value += 1
            number = self._requests.value
            roll, kind = self._rng.random(), self._rng.choice(self.kinds)
            chosen = kind if roll < self.rate else None
            if self.schedule is not None:
                chosen = self.schedule.get(number)
        if self.on_request is not None:
            self.on_request(number)
        with self._lock:
            if chosen is None or not self._enabled.value or sum(self._injected) >= self.max_faults:
                return None
            self._injected[KINDS.index(chosen)] += 1
            return chosen

    # --- one request ----------------------------------------------------------------------

    def _serve(self, client: socket.socket) -> None:
        if self._outage is not None and self._outage.value:
            _reset(client)
            return
        client.settimeout(self.timeout)
        reader = client.makefile("rb")
        try:
            request = _read_request(reader)
        except (OSError, ValueError):
            return
        if request is None:
            return
        method, target, headers, body = request
        fault = self._draw()
        try:
            if fault in _CANNED:
                status, reason, code, message = _CANNED[fault]
                _send(
                    client,
                    status,
                    reason,
                    [("Content-Type", "application/xml")],
                    _ERROR % (code, message),
                )
                return
            if fault == "reset_before":
                _reset(client)
                return
            if fault == "delay":
                time.sleep(self.delay_seconds)
            status, reason, answer_headers, answer = self._forward(method, target, headers, body)
            if fault == "reset_after":
                _reset(client)
                return
            if fault == "truncate" and len(answer) > 1:
                _send(client, status, reason, answer_headers, answer, cut=len(answer) // 2)
                return
            _send(client, status, reason, answer_headers, answer)
        except OSError:
            return
        finally:
            reader.close()
            client.close()

    def _forward(self, method: str, target: str, headers: list, body: bytes):
        host, port = self.upstream
        upstream = http.client.HTTPConnection(host, port, timeout=self.timeout)
        try:
            upstream.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                if name.lower() not in _HOP_BY_HOP:
                    upstream.putheader(name, value)
            if body or method in ("PUT", "POST"):
                upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body or None)
            answer = upstream.getresponse()
            data = answer.read()
            kept = [(k, v) for k, v in answer.getheaders() if k.lower() not in _HOP_BY_HOP]
            return answer.status, answer.reason, kept, data
        finally:
            upstream.close()


def _read_request(reader) -> tuple[str, str, list[tuple[str, str]], bytes] | None:
    line = reader.readline(65537)
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers: list[tuple[str, str]] = []
    while True:
        raw = reader.readline(65537)
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    fields = {k.lower(): v for k, v in headers}
    if "chunked" in fields.get("transfer-encoding", "").lower():
        body = b""
        while True:
            size = int(reader.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while reader.readline() not in (b"\r\n", b"\n", b""):
                    pass
                break
            body += reader.read(size)
            reader.readline()
    else:
        body = reader.read(int(fields.get("content-length") or 0))
    return method, target, headers, body


def _send(client, status, reason, headers, body: bytes, cut: int | None = None) -> None:
    head = [f"HTTP/1.1 {status} {reason}"]
    head += [f"{k}: {v}" for k, v in headers]
    head += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    client.sendall("\r\n".join(head).encode("latin-1") + (body if cut is None else body[:cut]))


def _reset(client: socket.socket) -> None:
    """Close with an RST instead of a FIN: the peer sees "connection reset"."""
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
