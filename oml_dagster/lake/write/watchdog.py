"""A time bound on a batch fold: past it, the fold fails loudly naming the op it was on, instead
of hanging a run and its tenant's lease.

The fold is plain Python, so a timer thread interrupts it with an asynchronous exception
(`PyThreadState_SetAsyncExc`), which the interpreter raises in the folding thread at its next
bytecode. That reaches a loop that never returns as well as a slow one.
"""

from __future__ import annotations

import ctypes
import threading
import time
from types import TracebackType
from typing import Literal

from oml_dagster.lake.errors import BatchTimeout


class _Expired(BaseException):
    """Raised inside the folding thread; BaseException so no `except Exception` swallows it."""


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


class Watchdog:
    """`with Watchdog(seconds, what) as dog:` around a fold; set `dog.on` to what the fold is
    doing now (it names the op in the error). Raises `BatchTimeout` once `seconds` pass."""

    def __init__(self, seconds: float | None, what: str):
        self.seconds, self.what = seconds, what
        self.on = "the start of the fold"
        self._lock = threading.Lock()
        self._armed = False
        self._fired = False
        self._timer: threading.Timer | None = None
        self._started = 0.0

    def __enter__(self) -> Watchdog:
        self._started = time.monotonic()
        if self.seconds is not None:
            thread_id = threading.get_ident()
            self._armed = True
            self._timer = threading.Timer(self.seconds, self._expire, (thread_id,))
            self._timer.daemon = True
            try:
                self._timer.start()
            except _Expired:  # a bound of ~0 s fired before the block began
                self.__exit__(_Expired, None, None)
        return self

    def _expire(self, thread_id: int) -> None:
        with self._lock:
            if self._armed:
                self._fired = True
                _raise_in(thread_id, _Expired)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        try:
            with self._lock:
                self._armed = False
                if self._timer is not None:
                    self._timer.cancel()
                fired = self._fired
            if fired and exc_type is not _Expired:
                # Set but not raised yet: withdraw it.
                _raise_in(threading.get_ident(), None)
        except _Expired:
            fired = True  # delivered just now, so nothing is left pending
        if fired:
            elapsed = time.monotonic() - self._started
            raise BatchTimeout(
                f"{self.what}: the fold ran past its bound of {self.seconds:g} s "
                f"({elapsed:.1f} s) while on {self.on}"
            ) from None
        return False
