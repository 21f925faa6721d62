"""What the lake-writer makes of a fault (ADR 0045): transient ones (a lost PostgreSQL session, an
object store's 5xx, throttling, a reset or a cut body) are retried with bounded, jittered
backoff; permanent ones (a full disk, a refused permission or login, a missing bucket, a schema not
upgraded, a store without put-if-absent) end with one line naming the cause, the object and the
remedy, and an exit code of their class. Anything else is a bug: one line too, and the traceback
under `--debug`.

Every commit is fenced by its table's txn version, so re-running a drain after a fault whose
outcome is unknown (a commit PUT reset after the store applied it) skips what landed and commits
what did not: retrying is always safe, never a second copy.
"""

from __future__ import annotations

import errno
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg

from oml_dagster.lake.errors import (
    BatchTimeout,
    ConflictingCommit,
    ExportTargetRefused,
    InvalidSetting,
    LakeError,
    PostgresUnreachable,
    RequeueError,
    TenantNotDeparted,
    TenantPurged,
    UnknownTenant,
    UnsupportedObjectStore,
    VerdictConflict,
)

T = TypeVar("T")

# The exit codes of `oml-lake`, one name each (README "Exit codes" is this table): every command
# returns one of these, and a fault's class (`Fault.exit_code`) picks among 2, 3, 4 and 70.
EXIT_OK = 0
EXIT_FINDINGS = 1  # a check found something
EXIT_USAGE = 2  # a usage error, or input refused
EXIT_PERMANENT = 3  # a person must fix something: configuration, credentials, space, schema
EXIT_TRANSIENT = 4  # transient faults outlasted the retry bound: the service stayed away
EXIT_INTERNAL = 70  # a bug (EX_SOFTWARE): the traceback is under --debug
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: what a shell reports for a command it stopped
EXIT_OUTPUT_CLOSED = 141  # stdout's reader went away (128 + SIGPIPE, as a shell reports it)


@dataclass(frozen=True)
class Fault:
    """One fault as a person reads it: `cause` (what happened), `subject` (where: the path, the
    store, the server), `remedy` (what to do)."""

    transient: bool
    cause: str
    subject: str
    remedy: str
    exit_code: int

    def line(self) -> str:
        subject = f" ({self.subject})" if self.subject else ""
        return f"{self.cause}{subject}: {self.remedy}"


class TransientFaultsOutlasted(LakeError):
    """Transient faults kept coming past the retry bound (`RetryPolicy`)."""

    def __init__(self, fault: Fault, attempts: int, seconds: float):
        self.fault = fault
        self.attempts = attempts
        self.seconds = seconds
        super().__init__(
            f"{fault.cause}{f' ({fault.subject})' if fault.subject else ''}: still failing after "
            f"{attempts} attempts over {seconds:.0f}s (the retry bound, OML_RETRY_ATTEMPTS / "
            f"OML_RETRY_SECONDS); {fault.remedy}"
        )


# --- classification ----------------------------------------------------------------------------

_NOTHING_LOST = "nothing committed is lost, and a rerun resumes where this one stopped"

# Text of errors from delta-rs / object_store / ADBC (they come as OSError, DeltaError or an ADBC
# error with the store's or libpq's message), lower-cased; the first rule that matches decides.
# Permanent rules come first: "403 Forbidden ... connection closed" is a credential problem.
_PERMANENT_TEXT: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (
        ("no space left on device", "os error 28", "disk full", "quota exceeded"),
        "disk full",
        "free space on the lake's volume (or point OML_LAKE_URI elsewhere), then rerun; "
        + _NOTHING_LOST,
    ),
    (
        ("conditional put is disabled", "putmode::create"),
        "object store without put-if-absent",
        "the lake needs conditional put: unset AWS_CONDITIONAL_PUT=disabled (or the storage "
        "option) and use a store that honours If-None-Match",
    ),
    (
        ("nosuchbucket", "bucket does not exist", "specified bucket does not exist"),
        "missing bucket",
        "create the bucket or fix OML_LAKE_URI",
    ),
    (
        (
            "invalidaccesskeyid",
            "signaturedoesnotmatch",
            "accessdenied",
            "access denied",
            "expiredtoken",
            "invalidtoken",
            "403 forbidden",
            "status 403",
            "missing credentials",
            "no credentials",
            "unable to locate credentials",
        ),
        "the object store refused the credentials",
        "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or the storage options, or the "
        "tenant's own in OML_TENANT_STORAGE_OPTIONS_DIR) and the bucket policy",
    ),
    (
        ("permission denied", "os error 13", "read-only file system", "os error 30"),
        "permission denied",
        "give the writer's user write access to the lake's path (or fix OML_LAKE_URI)",
    ),
)
# Word-bounded, so that a log path's digits ("…/00000000000000000500.json") or object_store's
# "retry_timeout: 180s", which every one of its errors carries, decide nothing.
_TRANSIENT_TEXT = re.compile(
    "|".join(
        (
            r"connection (reset|refused|closed|aborted)",
            r"broken pipe",
            r"timed out",
            r"\btimeout\b(?!:)",
            r"deadline has elapsed",
            r"error sending request",
            r"error trying to connect",
            r"request or response body error",
            r"error decoding response body",
            r"incomplete ?read",
            r"unexpected eof",
            r"end of file",
            r"slow ?down",
            r"reduce your request rate",
            r"throttl",
            r"too many requests",
            r"service unavailable",
            r"internalerror",
            r"we encountered an internal error",
            r"\b(500|502|503|504|429)\b",
            r"server closed the connection",
            r"terminating connection",
            r"the database system is (starting up|shutting down|in recovery mode)",
            r"could not connect",
            r"failed to connect",
            r"failed to parse parquet",  # a GET whose body was cut halfway
        )
    )
)
_PG_MISSING_SCHEMA = ("42P01", "3F000", "42883", "42703")  # table, schema, function, column
_PG_BAD_DSN = (
    "could not translate host name",
    "invalid dsn",
    'missing "="',
    "invalid integer value",
    "invalid connection option",
    "invalid sslmode",
    "invalid port",
)
_PG_TRANSIENT_STATES = ("57P01", "57P02", "57P03", "40001", "40P01", "53300", "08")


def _pg_subject(error: BaseException) -> str:
    info = getattr(getattr(error, "pgconn", None), "host", None)
    return f"PostgreSQL at {info.decode()}" if isinstance(info, bytes) and info else ""


def _postgres(error: BaseException) -> Fault | None:
    if not isinstance(error, psycopg.Error):
        return None
    state = getattr(error, "sqlstate", None) or ""
    text = str(error).lower()
    subject = _pg_subject(error)
    if state in _PG_MISSING_SCHEMA:
        return Fault(
            False,
            "schema oml is not upgraded",
            str(error).splitlines()[0],
            "run `oml-lake db upgrade` against OML_PG_DSN",
            EXIT_PERMANENT,
        )
    if (
        state.startswith("28")
        or "password authentication failed" in text
        or ("role" in text and "does not exist" in text)
    ):
        return Fault(
            False,
            "PostgreSQL refused the login",
            subject,
            "check the user and password of OML_PG_DSN",
            EXIT_PERMANENT,
        )
    if state == "3D000" or ("database" in text and "does not exist" in text):
        return Fault(
            False,
            "PostgreSQL has no such database",
            subject,
            "fix the database name in OML_PG_DSN",
            EXIT_PERMANENT,
        )
    if state == "42501":
        return Fault(
            False,
            "PostgreSQL denied a permission",
            str(error).splitlines()[0],
            "grant the writer's role what the README's roles section lists",
            EXIT_PERMANENT,
        )
    if any(n in text for n in _PG_BAD_DSN):
        return Fault(
            False,
            "OML_PG_DSN is malformed or names no server",
            str(error).splitlines()[0],
            "fix OML_PG_DSN",
            EXIT_PERMANENT,
        )
    if isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError)) or state.startswith(
        _PG_TRANSIENT_STATES
    ):
        return Fault(
            True,
            "PostgreSQL connection lost",
            subject,
            "check that PostgreSQL is up and reachable at OML_PG_DSN, then rerun; " + _NOTHING_LOST,
            EXIT_TRANSIENT,
        )
    return None


def _botocore(error: BaseException) -> Fault | None:
    try:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )
    except ImportError:  # pragma: no cover - botocore is a dependency
        return None
    if isinstance(error, (NoCredentialsError, PartialCredentialsError)):
        return _from_text("no credentials", str(error))
    if isinstance(error, ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        found = _from_text(f"{code} status {status}", str(error))
        if found is not None:
            return found
        if isinstance(status, int) and (status >= 500 or status == 429):
            return _transient_store(str(error))
        return None
    if isinstance(error, BotoCoreError):
        return _transient_store(str(error))
    return None


def _transient_store(message: str) -> Fault:
    return Fault(
        True,
        "object store or network fault",
        _first_line(message),
        "check the object store and the network to it, then rerun; " + _NOTHING_LOST,
        EXIT_TRANSIENT,
    )


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _first_line(message: str, most: int = 300) -> str:
    """An error's text on one line: delta-rs prints its chain of causes one per line, each
    behind a colored "↳"; the object (the URL or path) is usually in the second."""
    parts = [p.strip().lstrip("↳").strip() for p in _ANSI.sub("", message).splitlines()]
    line = " <- ".join(p for p in parts if p)
    return line if len(line) <= most else line[: most - 1] + "…"


def _from_text(text: str, message: str) -> Fault | None:
    """A fault from an error's text (delta-rs, object_store, ADBC, botocore), or None."""
    lowered = f"{text} {message}".lower()
    for needles, cause, remedy in _PERMANENT_TEXT:
        if any(n in lowered for n in needles):
            return Fault(False, cause, _first_line(message), remedy, EXIT_PERMANENT)
    if _TRANSIENT_TEXT.search(lowered):
        return _transient_store(message)
    return None


_OS_PERMANENT = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "read-only file system",
}
_OS_TRANSIENT = {
    errno.ECONNRESET,
    errno.ECONNREFUSED,
    errno.ECONNABORTED,
    errno.EPIPE,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
}


def _own(error: BaseException) -> Fault | None:
    if isinstance(error, PostgresUnreachable):
        return Fault(
            False,
            str(error),
            "",
            "nothing was connected, so nothing is lost; start PostgreSQL there or fix "
            f"OML_PG_DSN (tried for {error.seconds:.0f} s: OML_PG_CONNECT_SECONDS)",
            EXIT_TRANSIENT,
        )
    if isinstance(error, (ConflictingCommit, VerdictConflict)):
        # Another writer moved the table or the verdicts: the next attempt reloads and folds
        # with what it recorded.
        return Fault(
            True, type(error).__name__, str(error), "rerun; " + _NOTHING_LOST, EXIT_TRANSIENT
        )
    if isinstance(error, (UnsupportedObjectStore, InvalidSetting)):
        # Their message names the setting or store and what to change.
        return Fault(False, type(error).__name__, "", str(error), EXIT_PERMANENT)
    if isinstance(error, RequeueError):
        return Fault(False, "refused", "", str(error), EXIT_USAGE)
    if isinstance(error, UnknownTenant):
        return Fault(False, "unknown tenant", "", str(error), EXIT_USAGE)
    if isinstance(error, (TenantNotDeparted, TenantPurged, ExportTargetRefused)):
        return Fault(False, "refused", "", str(error), EXIT_USAGE)
    if isinstance(error, BatchTimeout):
        return Fault(
            False,
            "batch fold timed out",
            str(error),
            "raise OML_FOLD_TIMEOUT_SECONDS or lower OML_MAX_BATCH, then rerun",
            EXIT_PERMANENT,
        )
    if isinstance(error, LakeError):
        return Fault(False, type(error).__name__, "", str(error), EXIT_PERMANENT)
    return None


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        # `raise ... from None` hides the context on purpose (a closed stdout's BrokenPipeError
        # under the command's OutputClosed is no network fault).
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )


def classify(error: BaseException) -> Fault | None:
    """The fault `error` is, from it or the errors it was raised from; None when it is none the
    writer knows (a bug)."""
    for link in _chain(error):
        for rule in (_own, _postgres, _botocore):
            found = rule(link)
            if found is not None:
                return found
        if isinstance(link, OSError) and link.errno in _OS_PERMANENT:
            return _from_text(_OS_PERMANENT[link.errno], f"{link}")
        if isinstance(link, OSError) and link.errno in _OS_TRANSIENT:
            return _transient_store(str(link))
    for link in _chain(error):
        if isinstance(link, (OSError, TimeoutError)) or _is_library_error(link):
            found = _from_text("", str(link))
            if found is not None:
                return found
    return None


def _is_library_error(error: BaseException) -> bool:
    """An error of delta-rs or ADBC, whose kind is in its text. A query through delta-rs's
    QueryBuilder (DataFusion) fails with a bare `Exception` ("External error: Parquet error: ...
    Object Store error: ... error sending request"): the project raises none of its own."""
    module = type(error).__module__ or ""
    return (
        module.startswith(("deltalake", "adbc_driver", "_internal"))
        or type(error).__name__ in ("DeltaError", "CommitFailedError")
        or type(error) is Exception
    )


def describe(error: BaseException) -> tuple[str, int]:
    """The one line a person reads for `error` (cause, object, remedy), and the exit code of its
    class: what `oml-lake` prints and a Dagster run's failure reads."""
    if isinstance(error, TransientFaultsOutlasted):
        return str(error), EXIT_TRANSIENT
    fault = classify(error)
    if fault is not None:
        return fault.line(), fault.exit_code
    first = _first_line(str(error))
    return (
        f"internal error: {type(error).__name__}{f': {first}' if first else ''} (a bug: rerun "
        "with --debug for the traceback and report it)",
        EXIT_INTERNAL,
    )


def is_transient(error: BaseException) -> bool:
    fault = classify(error)
    return fault is not None and fault.transient


# --- retrying ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How long a streak of transient faults is ridden through: at most `attempts` tries and
    `seconds` from the streak's first fault (whichever comes first); a try that made progress
    ends the streak. Backoff doubles from `base_seconds` up to `cap_seconds`, with full jitter
    (a uniform draw below it), so writers that lost the same server do not return in step."""

    attempts: int = 30
    seconds: float = 300.0
    base_seconds: float = 0.25
    cap_seconds: float = 15.0

    def __post_init__(self) -> None:
        if (
            self.attempts < 1
            or not self.seconds >= 0
            or not 0 < self.base_seconds <= self.cap_seconds
        ):
            raise ValueError(f"a retry policy needs attempts >= 1 and 0 < base <= cap: {self}")

    def backoff(self, failures: int, rng: random.Random | None = None) -> float:
        """The wait after the `failures`-th fault in a row (1-based)."""
        ceiling = min(self.cap_seconds, self.base_seconds * 2 ** (failures - 1))
        return (rng or random).uniform(self.base_seconds / 2, ceiling)


@dataclass
class Streak:
    """The transient faults met since the last progress."""

    policy: RetryPolicy
    failures: int = 0
    started: float | None = None

    def record(self, fault: Fault, now: float | None = None) -> float:
        """Count `fault`; the wait before the next try, or TransientFaultsOutlasted past the
        bound."""
        now = time.monotonic() if now is None else now
        if self.started is None:
            self.started = now
        self.failures += 1
        elapsed = now - self.started
        wait = self.policy.backoff(self.failures)
        if self.failures >= self.policy.attempts or elapsed + wait > self.policy.seconds:
            raise TransientFaultsOutlasted(fault, self.failures, elapsed)
        return wait

    def progressed(self) -> None:
        self.failures, self.started = 0, None


def retrying(
    attempt: Callable[[], T],
    policy: RetryPolicy,
    *,
    on_retry: Callable[[Fault, int, float], None] | None = None,
    progressed: Callable[[], bool] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`attempt()` until it returns, retrying transient faults within `policy`;
    `on_retry(fault, failures, wait)` is told of each retry before its wait; `progressed()`,
    asked after a fault, says whether the failed try got somewhere (then the streak restarts).
    A permanent fault or a bug propagates as it is; the last transient one past the bound as
    TransientFaultsOutlasted (raised from it)."""
    streak = Streak(policy)
    while True:
        try:
            return attempt()
        except Exception as error:
            fault = classify(error)
            if fault is None or not fault.transient:
                raise
            if progressed is not None and progressed():
                streak.progressed()
            try:
                wait = streak.record(fault)
            except TransientFaultsOutlasted as outlasted:
                raise outlasted from error
            if on_retry is not None:
                on_retry(fault, streak.failures, wait)
            sleep(wait)


# --- the first connection ----------------------------------------------------------------------

FIRST_CONTACT_SECONDS = 5.0
_FIRST_CONTACT_PAUSE = (0.25, 1.0)  # between tries: doubling from the first, capped at the second
_LIBPQ_LEAST_TIMEOUT = 2  # libpq treats a connect_timeout below 2 s as 2 s


@dataclass
class Connector:
    """Connections to one PostgreSQL server (`dsn`) that tell a server never reached from one
    lost (ADR 0070). Until a first connection has succeeded, a try that fails the way a server
    that is not there fails (refused, timed out, starting up: what `classify` calls transient)
    is tried again, for at most `first_contact_seconds` in all, then PostgresUnreachable names
    the host, the port and the reason; a refused login or an unknown database propagates at once,
    as it always did. Once one connection succeeded, a failed one raises psycopg's own error,
    which the caller rides through as a lost connection (`retrying`). One Connector per process
    and server: whether the server was ever reached is what it remembers."""

    dsn: str
    first_contact_seconds: float = FIRST_CONTACT_SECONDS
    reached: bool = False

    def connect(self, *, autocommit: bool = True) -> psycopg.Connection:
        if self.reached:
            return psycopg.connect(self.dsn, autocommit=autocommit)
        connection = self._first_contact(autocommit)
        self.reached = True
        return connection

    def _first_contact(self, autocommit: bool) -> psycopg.Connection:
        started = time.monotonic()
        pause = _FIRST_CONTACT_PAUSE[0]
        own_timeout = "connect_timeout" in psycopg.conninfo.conninfo_to_dict(self.dsn)
        while True:
            left = self.first_contact_seconds - (time.monotonic() - started)
            # A server that drops packets (no refusal) would hold a try for the kernel's TCP
            # timeout, minutes: each try is bounded by what is left of the bound.
            timeout: dict[str, Any] = (
                {}
                if own_timeout
                else {"connect_timeout": max(_LIBPQ_LEAST_TIMEOUT, int(left + 0.999))}
            )
            try:
                return psycopg.connect(self.dsn, autocommit=autocommit, **timeout)
            except psycopg.OperationalError as error:
                fault = classify(error)
                if fault is None or not fault.transient:
                    raise
                waited = time.monotonic() - started
                if waited + pause > self.first_contact_seconds:
                    raise PostgresUnreachable(
                        _address(error, self.dsn), _reason(error), self.first_contact_seconds
                    ) from error
                time.sleep(pause)
                pause = min(_FIRST_CONTACT_PAUSE[1], pause * 2)


def _address(error: psycopg.Error, dsn: str) -> str:
    """HOST:PORT of the server tried: the connection attempt's own, else the DSN's."""
    pgconn = getattr(error, "pgconn", None)
    host = pgconn.host.decode() if pgconn is not None and pgconn.host else ""
    port = pgconn.port.decode() if pgconn is not None and pgconn.port else ""
    if not host:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        host, port = str(info.get("host") or "localhost"), str(info.get("port") or "5432")
    return f"{host}:{port or '5432'}"


def _reason(error: psycopg.Error) -> str:
    """libpq's reason on its own: "connection refused", "timeout expired", "the database
    system is starting up"."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    reason = first.rsplit(" failed: ", 1)[-1].strip()
    return re.sub(r"^(FATAL|ERROR):\s+", "", reason).strip().lower() or "no answer"
