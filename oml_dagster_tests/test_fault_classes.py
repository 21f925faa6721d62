"""Which faults are ridden through and which end with one line (ADR 0045): the classes of real
errors from PostgreSQL, the file system and the object store's messages, the retry bound, and the
backoff's jitter for every streak."""

from __future__ import annotations

import errno
import random

import psycopg
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from hypothesis import given, settings
from hypothesis import strategies as st

from oml_dagster.lake.errors import ConflictingCommit, InvalidSetting, UnsupportedObjectStore
from oml_dagster.lake.faults import (
    EXIT_INTERNAL,
    EXIT_PERMANENT,
    EXIT_TRANSIENT,
    RetryPolicy,
    Streak,
    TransientFaultsOutlasted,
    classify,
    describe,
    retrying,
)
from oml_testbed.s3_server import _free_loopback_port


def _raised(work) -> Exception:
    try:
        work()
    except Exception as error:
        return error
    raise AssertionError("expected an error")


# --- PostgreSQL --------------------------------------------------------------------------------


def test_a_server_that_is_not_there_is_transient():
    port = _free_loopback_port()  # nothing listens there
    error = _raised(lambda: psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/x"))
    fault = classify(error)
    assert fault is not None and fault.transient and fault.exit_code == EXIT_TRANSIENT
    assert "PostgreSQL" in fault.line()


def test_a_killed_session_is_transient(dsn):
    with psycopg.connect(dsn, autocommit=True) as victim, psycopg.connect(dsn) as killer:
        pid = victim.info.backend_pid
        killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
        error = _raised(lambda: victim.execute("SELECT 1"))
    assert isinstance(error, psycopg.OperationalError)
    assert classify(error).transient


def test_an_unknown_database_and_a_missing_schema_are_permanent(dsn):
    unknown = psycopg.conninfo.make_conninfo(dsn, dbname="no_such_database_here")
    error = _raised(lambda: psycopg.connect(unknown))
    fault = classify(error)
    assert not fault.transient and fault.exit_code == EXIT_PERMANENT
    assert "no such database" in fault.line() and "OML_PG_DSN" in fault.line()
    with psycopg.connect(dsn, autocommit=True) as conn:
        missing = _raised(lambda: conn.execute("SELECT * FROM oml.no_such_table"))
    fault = classify(missing)
    assert not fault.transient and "oml-lake db upgrade" in fault.line()
    malformed = _raised(lambda: psycopg.connect(dsn + " port=5432/x"))
    assert classify(malformed).cause == "OML_PG_DSN is malformed or names no server"


# --- files and object stores -----------------------------------------------------------------


def test_a_full_disk_is_permanent_and_says_nothing_is_lost(tmp_path):
    fault = classify(OSError(errno.ENOSPC, "No space left on device", str(tmp_path)))
    assert not fault.transient and fault.cause == "disk full"
    assert "free space" in fault.remedy and "nothing committed is lost" in fault.remedy
    # delta-rs's own wording, through its OSError with no errno
    text = OSError("Generic LocalFileSystem error | Unable to write: No space left on device")
    assert classify(text).cause == "disk full"


@pytest.mark.parametrize(
    "message",
    [
        "Generic S3 error: Error performing PUT http://127.0.0.1:9/b/t/_delta_log/"
        "00000000000000000003.json in 3ms - Connection reset by peer (os error 104)",
        "Generic S3 error: Error performing GET http://127.0.0.1:9/b/t/_delta_log/"
        "_last_checkpoint in 1s - error decoding response body",
        "Generic S3 error: Server returned non-2xx status code: 503 Service Unavailable: "
        "<Error><Code>SlowDown</Code></Error>",
        "Failed to parse parquet: External: Generic S3 error: request or response body error",
    ],
)
def test_store_faults_that_may_pass_are_transient(message):
    assert classify(OSError(message)).transient


@pytest.mark.parametrize(
    ("message", "cause"),
    [
        (
            "Generic S3 error: Client error with status 404 Not Found: <Code>NoSuchBucket</Code>",
            "missing bucket",
        ),
        (
            "Generic S3 error: status 403 Forbidden: <Code>InvalidAccessKeyId</Code>",
            "the object store refused the credentials",
        ),
        (
            "Operation put_opts with mode PutMode::Create when conditional put is disabled not "
            "yet implemented",
            "object store without put-if-absent",
        ),
    ],
)
def test_store_faults_a_person_must_fix_are_permanent(message, cause):
    fault = classify(OSError(message))
    assert not fault.transient and fault.cause == cause


def test_a_log_path_s_digits_and_the_store_s_retry_timeout_decide_nothing():
    # object_store puts "retry_timeout: 180s" in every error, and a log entry's name has digits
    message = (
        "Generic S3 error: Error performing HEAD http://127.0.0.1:9/b/t/_delta_log/"
        "00000000000000000500.json in 2ms, after 0 retries, max_retries: 10, retry_timeout: 180s"
        " - Client error with status 400 Bad Request"
    )
    assert classify(OSError(message)) is None


def test_a_query_s_bare_exception_is_read_by_its_text():
    """delta-rs's QueryBuilder (DataFusion) raises a bare `Exception` for a store fault met while
    reading a table (found by the fault-schedule property: a drain stopped as a 'bug')."""
    message = (
        "External error: Parquet error: Parquet error: Failed to fetch metadata for file t/gold/"
        "areas/part-00000.snappy.parquet: Object Store error: Generic S3 error: Error performing "
        "GET http://127.0.0.1:9/b/t/gold/areas/part-00000.snappy.parquet in 30.0s - HTTP error: "
        "error sending request"
    )
    assert classify(Exception(message)).transient
    # a bare Exception with no store wording stays unknown: a bug, not retried
    assert classify(Exception("tenant_id")) is None


def test_botocore_errors_by_code():
    slow = ClientError(
        {"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject"
    )
    assert classify(slow).transient
    bucket = ClientError(
        {"Error": {"Code": "NoSuchBucket"}, "ResponseMetadata": {"HTTPStatusCode": 404}},
        "PutObject",
    )
    assert classify(bucket).cause == "missing bucket"
    assert classify(EndpointConnectionError(endpoint_url="http://127.0.0.1:9")).transient
    # The probe wraps what it met: the cause decides.
    try:
        raise OSError("cannot probe object store") from bucket
    except OSError as wrapped:
        assert classify(wrapped).cause == "missing bucket"


def test_the_writer_s_own_errors():
    assert classify(ConflictingCommit("silver.claims of tenant t")).transient
    refusal = classify(UnsupportedObjectStore("store x ignores If-None-Match"))
    assert not refusal.transient and "UnsupportedObjectStore" in refusal.line()
    assert classify(InvalidSetting("OML_MAX_BATCH='x'")).exit_code == EXIT_PERMANENT


def test_an_unknown_error_is_a_bug_said_in_one_line():
    line, code = describe(KeyError("tenant_id"))
    assert code == EXIT_INTERNAL
    assert line.startswith("internal error: KeyError") and "--debug" in line
    assert "\n" not in line


# --- the bound and the backoff ---------------------------------------------------------------

_TRANSIENT = OSError("Connection reset by peer (os error 104)")


def test_transient_faults_are_retried_until_the_work_succeeds():
    calls, waits = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 4:
            raise _TRANSIENT
        return "done"

    policy = RetryPolicy(attempts=5, seconds=60, base_seconds=0.01, cap_seconds=0.05)
    told = []
    assert retrying(flaky, policy, on_retry=lambda *a: told.append(a), sleep=waits.append) == "done"
    assert len(calls) == 4 and len(told) == 3 and len(waits) == 3
    assert [failures for _, failures, _ in told] == [1, 2, 3]


def test_a_permanent_fault_is_not_retried():
    calls = []

    def full():
        calls.append(1)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        retrying(full, RetryPolicy(), sleep=lambda _: None)
    assert len(calls) == 1


def test_past_the_bound_the_last_fault_is_said_with_the_bound():
    policy = RetryPolicy(attempts=3, seconds=60, base_seconds=0.01, cap_seconds=0.01)

    def always():
        raise _TRANSIENT

    with pytest.raises(TransientFaultsOutlasted) as outlasted:
        retrying(always, policy, sleep=lambda _: None)
    assert outlasted.value.attempts == 3
    line, code = describe(outlasted.value)
    assert code == EXIT_TRANSIENT and "3 attempts" in line and "OML_RETRY_ATTEMPTS" in line


def test_a_try_that_got_somewhere_restarts_the_streak():
    policy = RetryPolicy(attempts=2, seconds=60, base_seconds=0.01, cap_seconds=0.01)
    calls = []

    def progressing():
        calls.append(1)
        if len(calls) < 6:
            raise _TRANSIENT
        return len(calls)

    # Each failed try made progress, so a bound of 2 tries never runs out.
    assert retrying(progressing, policy, progressed=lambda: True, sleep=lambda _: None) == 6
    with pytest.raises(TransientFaultsOutlasted):
        calls.clear()
        retrying(progressing, policy, progressed=lambda: False, sleep=lambda _: None)


@settings(max_examples=200, deadline=None)
@given(
    attempts=st.integers(1, 50),
    seconds=st.floats(0, 600),
    base=st.floats(0.001, 2),
    cap_factor=st.floats(1, 100),
    gaps=st.lists(st.floats(0, 30), max_size=80),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_streak_never_outlasts_its_bound(attempts, seconds, base, cap_factor, gaps, seed):
    """For every policy and every spacing of faults: each wait lies within the jitter's range,
    and a streak is given up at its attempt count or before its time bound is passed."""
    policy = RetryPolicy(attempts, seconds, base, base * cap_factor)
    streak, now, rng = Streak(policy), 0.0, random.Random(seed)
    random.seed(seed)
    fault = classify(_TRANSIENT)
    for tries, gap in enumerate(gaps, start=1):
        try:
            wait = streak.record(fault, now=now)
        except TransientFaultsOutlasted as outlasted:
            assert outlasted.attempts == tries <= attempts
            break
        ceiling = min(policy.cap_seconds, base * 2 ** (tries - 1))
        assert base / 2 <= wait <= max(ceiling, base / 2)
        assert tries < attempts
        assert now + wait <= seconds  # the next try starts within the bound
        now += wait + gap * rng.random()
