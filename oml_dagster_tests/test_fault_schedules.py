"""The property behind riding through faults (ADR 0045): under any schedule of faults -- object
store requests failed in each way the fault proxy knows, and the writer's PostgreSQL sessions
killed before chosen requests (so between a table's commit and the next, or between the lake's
commit and PostgreSQL's record of it) -- a riding-through drain finishes, and the lake it leaves
equals the lake of a fault-free drain of the same outbox.

Real parts throughout: the shared PostgreSQL server, moto behind the proxy, deltalake. Each
example drains the same outbox into a fresh prefix of one bucket; the reference lake, in the
same bucket, is drained once."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oml_dagster.lake.faults import RetryPolicy
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.write.drain import DrainPolicy, drain, drain_riding_through
from oml_dagster.lake.write.writer import WriterConfig
from oml_dagster.simulate import producer
from oml_dagster_tests.helpers import assert_exactly_once, lake_snapshot
from oml_dagster_tests.test_commit_fence import mixed_workload
from oml_testbed.fault_proxy import KINDS, FaultProxy
from oml_testbed.s3_server import new_bucket, store_options

pytestmark = pytest.mark.s3

WRITER = "oml-fault-schedule-writer"
# Request numbers a schedule may name: a drain of the workload below makes a few hundred.
HORIZON = 240
EARLY = 20
# The kills made, with how many sessions each terminated (the hook runs in the proxy's process).
KILLS = "CREATE TABLE IF NOT EXISTS public.fault_schedule_kills (number int, killed int)"
# A quick streak bound: a schedule holds at most 8 faults, far below it.
RETRY = RetryPolicy(attempts=40, seconds=120, base_seconds=0.05, cap_seconds=0.4)

schedules = st.fixed_dictionaries(
    {
        "store": st.dictionaries(
            st.integers(1, HORIZON), st.sampled_from(KINDS), min_size=1, max_size=6
        ),
        # One fault among the first requests, which every drain makes: each example injects one.
        "early": st.tuples(st.integers(1, EARLY), st.sampled_from(KINDS)),
        "pg_kills": st.sets(st.integers(1, HORIZON), max_size=2),
        # object_store's own retries off (every fault reaches the writer) or the product's
        "store_retries": st.sampled_from(["0", None]),
        "max_batch": st.sampled_from([4, 9, 25]),
    }
)


class KillWriterSessions:
    """The proxy's hook (it runs in the proxy's process, so a class it can unpickle): before
    each request numbered in `at`, terminate the writer's PostgreSQL sessions, and record how
    many it did (table `KILLS`)."""

    def __init__(self, dsn: str, at: set[int]):
        self.dsn, self.at = dsn, frozenset(at)

    def __call__(self, number: int) -> None:
        if number in self.at:
            with psycopg.connect(self.dsn, autocommit=True) as admin:
                killed = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name = %s",
                    (WRITER,),
                ).fetchone()[0]
                admin.execute(
                    "INSERT INTO public.fault_schedule_kills VALUES (%s, %s)", (number, killed)
                )


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schedule=schedules)
def test_under_any_fault_schedule_the_lake_equals_a_fault_free_drain(
    schedule, moto_endpoint, dsn, conn
):
    tenants = _shared_workload(conn)
    ids = [t.tenant_id for t in tenants]
    bucket = _BUCKET.get(dsn) or _BUCKET.setdefault(dsn, new_bucket(moto_endpoint, "oml-schedule"))
    reference = _reference(
        conn, Lake(f"s3://{bucket}/reference", store_options(moto_endpoint)), ids
    )
    options = store_options("")
    conn.execute(KILLS)
    conn.execute("TRUNCATE public.fault_schedule_kills")
    early, kind = schedule["early"]
    store = {**schedule["store"], early: kind}
    if schedule["store_retries"] is not None:
        options["max_retries"] = schedule["store_retries"]
    with FaultProxy(
        moto_endpoint,
        schedule=store,
        on_request=KillWriterSessions(dsn, schedule["pg_kills"]),
        delay_seconds=0.2,
    ) as proxy:
        options["AWS_ENDPOINT_URL"] = proxy.endpoint
        lake = Lake(f"s3://{bucket}/{uuid.uuid4().hex[:10]}", options).with_store_defaults()
        drain_riding_through(
            lambda: psycopg.connect(dsn, autocommit=True, application_name=WRITER),
            lake,
            ids,
            retry=RETRY,
            policy=DrainPolicy(
                until_idle=True, config=WriterConfig.for_batch(schedule["max_batch"])
            ),
        )
        reached, injected = proxy.requests, proxy.injected
    # The schedule was played: a fault at each of its numbers the drain reached, a kill before
    # each such request, and the first kill terminated the writer's sessions (a later one may
    # come before the writer has noticed the last and reconnected).
    assert sum(injected.values()) == len([n for n in store if n <= reached]) >= 1, injected
    kills = conn.execute(
        "SELECT number, killed FROM public.fault_schedule_kills ORDER BY number"
    ).fetchall()
    assert [n for n, _ in kills] == sorted(n for n in schedule["pg_kills"] if n <= reached)
    assert not kills or kills[0][1] >= 1, kills
    direct = Lake(lake.root, {**options, "AWS_ENDPOINT_URL": moto_endpoint})
    assert_exactly_once(
        conn, direct, tenants, reference, f"schedule {schedule} ({reached} requests)"
    )


# The workload and the fault-free lake, made by the first example and kept for the rest (the
# fixtures are per test, and Hypothesis runs every example inside one test).
_WORKLOAD: dict[str, list] = {}
_REFERENCE: dict[str, dict] = {}
_BUCKET: dict[str, str] = {}


def _shared_workload(conn) -> list:
    dsn = conn.info.dsn
    if dsn not in _WORKLOAD:
        made = [producer.create_tenant(conn) for _ in range(2)]
        for keys in made:
            mixed_workload(conn, keys, claims=8)
        _WORKLOAD[dsn] = made
    return _WORKLOAD[dsn]


def _reference(conn, lake: Lake, ids: list[str]) -> dict:
    dsn = conn.info.dsn
    if dsn not in _REFERENCE:
        drain(conn, lake, ids, policy=DrainPolicy(until_idle=True))
        _REFERENCE[dsn] = {tenant: lake_snapshot(lake, tenant) for tenant in ids}
    return _REFERENCE[dsn]
