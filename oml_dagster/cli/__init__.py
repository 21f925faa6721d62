"""`oml-lake`: the lake-writer's command line. Environment: OML_PG_DSN, OML_LAKE_URI,
OML_LAKE_STORAGE_OPTIONS, OML_MAX_BATCH, OML_TXN_LAG_LIMIT, OML_RETRY_ATTEMPTS,
OML_RETRY_SECONDS, OML_ERASURE_CADENCE_SECONDS and the rest of `oml_dagster.settings` (the
README's settings table). An error ends a command with one line naming the cause, the object and
the remedy, and an exit code of its class (README "Exit codes"); `--debug` adds the traceback.

Why one file: the parser of every `oml-lake` command and the one-line error and exit-code
handling they share; each command's body is a short function that calls the core.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import getpass
import json
import logging
import os
import signal
import sys
import traceback
from typing import NoReturn

from oml_dagster import from_settings
from oml_dagster.lake import db
from oml_dagster.lake.audit.doctor import (
    DEFAULT_LAG_LIMIT,
    HOLDS,
    drained_through,
    erasure_verdict,
    examine,
    lost_tables,
)
from oml_dagster.lake.audit.erasure import APPLIED
from oml_dagster.lake.audit.purge import overdue_departures
from oml_dagster.lake.audit.reconcile import reconcile
from oml_dagster.lake.audit.reconcile import record as record_checks
from oml_dagster.lake.errors import RequeueError
from oml_dagster.lake.faults import (
    EXIT_FINDINGS,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_OUTPUT_CLOSED,
    EXIT_USAGE,
    Fault,
    RetryPolicy,
    describe,
    retrying,
)
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.policy import lag, resolve_tenants
from oml_dagster.lake.write import deadletter
from oml_dagster.lake.write.counters import WriterCounters
from oml_dagster.lake.write.drain import DrainObserver, DrainPass, DrainPolicy, drain_riding_through
from oml_dagster.lake.write.writer import COMMITS, BatchResult
from oml_dagster.settings import DEBUG, WRITER_PASSWORD

from . import analytics as analytics_cli
from . import exporter as exporter_cli
from . import lake_tables as lake_tables_cli
from . import maintenance as maintenance_cli
from . import tenant as tenant_cli
from .output import OutputClosed
from .output import out as _print
from .panics import native_panics_filtered, terminal_stderr
from .simulate import register as register_simulate


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    with from_settings.connect() as conn:
        applied = db.upgrade(conn)
        for role in args.writer_role or []:
            db.create_writer_role(conn, role, WRITER_PASSWORD.read())
    for m in applied:
        _print(f"applied {m.version:04d}_{m.name}")
    if not applied:
        _print("schema oml is up to date")
    for role in args.writer_role or []:
        _print(f"writer role {role}: may log in, holds nothing outside a tenant or cross scope")
    return EXIT_OK


def _report_cut(report: sequencer.SequencerReport) -> None:
    for cut in sorted(report.tenants.values(), key=lambda c: c.tenant_id):
        _print(
            f"sequenced tenant {cut.tenant_id}: {cut.sequenced} rows, seq {cut.first_seq}..{cut.last_seq},"
            f" journal_seq through {cut.last_journal_seq}"
        )
    for gap in report.gaps:
        _print(
            f"waiting tenant {gap.tenant_id}: {gap.waiting_rows} rows behind missing journal_seq "
            f"{gap.missing_journal_seq} (oldest waiting {gap.age_seconds:.1f}s)"
        )
    if report.deferred_rows:
        _print(f"deferred to the next cut: {report.deferred_rows} rows")


def cmd_sequence(args: argparse.Namespace) -> int:
    with from_settings.connect() as conn:
        report = sequencer.sequence(conn)
    _report_cut(report)
    if not report.tenants:
        _print("nothing to sequence")
    return EXIT_OK


def _cadence(hours: float | None) -> dt.timedelta:
    return dt.timedelta(hours=hours) if hours is not None else from_settings.erasure_cadence()


def retry_policy() -> RetryPolicy:
    """The bound of a streak of transient faults, from OML_RETRY_ATTEMPTS / OML_RETRY_SECONDS."""
    return from_settings.retry_policy()


def _retrying(fault: Fault, failures: int, wait: float) -> None:
    print(
        f"oml-lake: {fault.cause}{f' ({fault.subject})' if fault.subject else ''}; "
        f"retrying in {wait:.1f}s (fault {failures} in a row)",
        file=sys.stderr,
        flush=True,
    )


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM (a scheduler stopping the command) ends the drain as Ctrl-C does, with its
    summary; the previous handler comes back after."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave SIGTERM alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _DrainPrinted(DrainObserver):
    """What `oml-lake drain` prints as it goes: each batch as it lands, flushed (a drain stopped
    part way has said what it did), each sequencing cut and each retry; with the batch lines
    going to a file or pipe and a terminal on stderr, a progress bar of the ops drained shows a
    long drain moving (on a terminal the batch lines themselves do)."""

    def __init__(self) -> None:
        self.drained: set[str] = set()
        self.committed = {"batches": 0, "ops": 0, "refused": 0}
        self.reached: dict[str, int] = {}  # each tenant's last batch end committed or refused
        self.bar = None
        terminal = terminal_stderr() if not sys.stdout.isatty() else None
        if terminal is not None:
            from tqdm import tqdm

            self.bar = tqdm(unit=" ops", file=terminal, desc="drained")

    def batch_ended(self, result: BatchResult) -> None:
        self.drained.add(result.tenant_id)
        head = f"tenant {result.tenant_id} batch ({result.batch_start}, {result.batch_end}]"
        _print(f"{head}: {result.ops} ops, {len(result.refused)} refused")
        for t in result.tables:
            if t.action in COMMITS:
                _print(
                    f"  {t.table}: {t.action} {t.rows} rows, txn {t.txn_after}, version {t.version}"
                )
        for seq, reason in sorted(result.refused.items()):
            _print(f"  dead-lettered seq {seq}: {reason}")
        if result.committed or result.refused:
            self.committed["batches"] += 1
            self.committed["ops"] += result.ops
            self.committed["refused"] += len(result.refused)
            self.reached[result.tenant_id] = result.batch_end
        if self.bar is not None:
            self.bar.update(result.ops)

    def pass_ended(self, drained: DrainPass) -> None:
        _report_cut(drained.sequenced)

    def retrying(self, fault: Fault, failures: int, wait: float) -> None:
        _retrying(fault, failures, wait)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_drain(args: argparse.Namespace) -> int:
    lake = from_settings.lake()
    config = from_settings.writer_config(args.max_batch)
    retry = retry_policy()
    tenants = None
    if args.tenant:  # an unknown tenant is refused before anything is sequenced or written
        with from_settings.connect() as conn:
            tenants = resolve_tenants(conn, args.tenant)

    printed = _DrainPrinted()
    try:
        with _terminate_as_interrupt():
            passes = drain_riding_through(
                lambda: from_settings.connect(),
                lake,
                tenants,
                retry=retry,
                policy=DrainPolicy(until_idle=args.until_idle, config=config),
                observer=printed,
                counters=WriterCounters(lambda: from_settings.connect()),
            )
    except KeyboardInterrupt:
        committed = printed.committed
        where = "; ".join(f"tenant {t} through seq {s}" for t, s in sorted(printed.reached.items()))
        print(
            f"oml-lake drain: interrupted after {committed['batches']} committed batches "
            f"({committed['ops']} ops, {committed['refused']} dead-lettered)"
            f"{': ' + where if where else ''}. Nothing committed is lost; the next drain finishes "
            "the batch under way (the fence skips what of it landed): rerun `oml-lake drain`",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_INTERRUPTED
    finally:
        printed.close()

    # The closing lag is what the lake and PostgreSQL say now, not what this process drained:
    # another writer may have drained on meanwhile. It rides through faults as the drain does.
    def closing_lags() -> list[tuple[str, int, float, int]]:
        with from_settings.connect() as conn:
            return [
                (tenant_id, *lag(conn, tenant_id, through), through)
                for tenant_id in sorted(printed.drained)
                for through in [drained_through(lake, tenant_id)]
            ]

    for tenant_id, pending, seconds, through in retrying(closing_lags, retry, on_retry=_retrying):
        _print(
            f"lag tenant {tenant_id}: {pending} ops, {seconds:.1f}s (drained through seq {through})"
        )
    gaps = passes[-1].sequenced.gaps if passes else []
    for gap in gaps:
        _print(
            f"gap tenant {gap.tenant_id}: {gap.waiting_rows} rows wait for journal_seq {gap.missing_journal_seq}"
        )
    return EXIT_OK


def cmd_erasure_evidence(args: argparse.Namespace) -> int:
    """Exit 1 unless the SLO holds for every tenant: a breach, or an erasure at risk (which waits
    on an operator), is what `doctor` reports too, from the same verdict."""
    lake = from_settings.lake()
    cadence = _cadence(args.cadence_hours)
    unwell = False
    with from_settings.connect() as conn:
        for tenant_id in resolve_tenants(conn, args.tenant):
            verdict = erasure_verdict(conn, lake, tenant_id, cadence=cadence)
            evidence, per_artifact = verdict.evidence, verdict.artifacts
            assert evidence is not None and per_artifact is not None  # a verdict carries both
            # Evidence read from a lake that is not all there is no evidence of the lost part.
            lost = lost_tables(conn, lake, tenant_id)
            unwell |= verdict.state != HOLDS or bool(lost)
            if args.json:
                report = per_artifact.as_dict()
                report.update(
                    ok=verdict.state == HOLDS and not lost,
                    verdict=verdict.as_dict(),
                    lost_tables=lost,
                    findings=verdict.breaches + verdict.risks,
                )
                _print(json.dumps(report))
                continue
            _print(f"tenant {tenant_id}: {verdict.headline()}")
            for t in evidence.tables:
                _print(
                    f"  {t.table}: {t.erased_rows} erased rows ({t.erased_rows_with_body} with a "
                    f"body), {t.live_files} live files, {t.unreferenced_files} unreferenced, "
                    f"{len(t.overdue_files)} overdue, {len(t.overdue_log_entries)} overdue log entries"
                )
            _print(
                f"  erases: {len(evidence.pending_erases)} pending, "
                f"{len(evidence.dead_lettered_erases)} dead-lettered"
            )
            gone = [a for a in per_artifact.artifacts if not a.copies and a.status == APPLIED]
            _print(
                f"  erased versions: {len(per_artifact.artifacts)}, {len(gone)} gone from every "
                "file (the others below; --json lists all)"
            )
            for a in per_artifact.artifacts:
                if not a.copies and a.status == APPLIED:
                    continue
                classes = sorted({c.copy_class for c in a.copies})
                copies = f"{len(a.copies)} copies ({', '.join(classes)})" if a.copies else "gone"
                _print(
                    f"  erased {a.artifact_id} v{a.version} ({a.status}) at "
                    f"{a.erased_at:%Y-%m-%dT%H:%M:%SZ}, deadline {a.deadline:%Y-%m-%dT%H:%M:%SZ}: "
                    f"{copies}"
                )
            for line in verdict.breaches:
                _print(f"  BREACH: {line}")
            for line in verdict.risks:
                _print(f"  at risk: {line}")
            if lost:
                _print(
                    f"  FINDING: a lost lake: {len(lost)} tables the frontier records are missing "
                    f"({', '.join(lost)}); the evidence covers what is left: backfill the tenant"
                )
        unwell |= _overdue_departures(conn, args)
    return EXIT_FINDINGS if unwell else EXIT_OK


def _overdue_departures(conn, args: argparse.Namespace) -> bool:
    """Print each departed tenant (of those named, or every one) past its deadline and not
    purged: a breach in `doctor` and `erasure-evidence` alike. Whether there was one."""
    named = [str(t).lower() for t in args.tenant] if args.tenant else None
    found = overdue_departures(conn, tenants=named)
    for departure in found:
        if args.json:
            _print(
                json.dumps(
                    {
                        "tenant_id": departure.tenant_id,
                        "ok": False,
                        "departure": departure.as_dict(),
                        "findings": [departure.finding()],
                    }
                )
            )
        else:
            _print(f"BREACH: {departure.finding()}")
    return bool(found)


def cmd_reconcile(args: argparse.Namespace) -> int:
    lake = from_settings.lake()
    found = False
    with from_settings.connect() as conn:
        for tenant_id in resolve_tenants(conn, args.tenant):
            result = reconcile(conn, lake, tenant_id)
            record_checks(conn, result)
            found |= not result.ok
            if args.json:
                _print(json.dumps(result.as_dict()))
                continue
            failed = result.failed()
            _print(
                f"tenant {tenant_id}: {'agrees' if result.ok else 'FINDINGS'} "
                f"({len(result.results) - len(failed)} of {len(result.results)} checks pass)"
            )
            for r in result.results:
                verdict = "pass" if r.passed else f"FAIL {len(r.findings)}"
                _print(f"  {r.table} {r.name}: {verdict} ({r.checked} checked)")
                for line in r.samples(args.samples):
                    _print(f"    {line}")
    return EXIT_FINDINGS if found else EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    lake = from_settings.lake()
    cadence = _cadence(args.cadence_hours)
    lag_limit = dt.timedelta(seconds=args.lag_seconds)
    unwell = False
    with from_settings.connect() as conn:
        for tenant_id in resolve_tenants(conn, args.tenant):
            health = examine(conn, lake, tenant_id, cadence=cadence, lag_limit=lag_limit)
            unwell |= not health.healthy
            if args.json:
                _print(json.dumps(health.as_dict(), default=str))
                continue
            _print(
                f"tenant {tenant_id}: {'ok' if health.healthy else 'NEEDS AN OPERATOR'}; lag "
                f"{health.lag_ops} ops, {health.lag_seconds:.0f}s; {health.dead_letters} open "
                f"dead letters; {len(health.checkpoint_overdue)} tables past their checkpoint "
                f"interval; {len(health.failed_checks)} failed checks; "
                f"{health.erasure.headline() if health.erasure else 'erasure SLO not judged'}"
            )
            for problem in health.problems:
                _print(f"  {problem}")
        unwell |= _overdue_departures(conn, args)
    return EXIT_FINDINGS if unwell else EXIT_OK


def cmd_deadletter_list(args: argparse.Namespace) -> int:
    with from_settings.connect() as conn:
        (tenant_id,) = resolve_tenants(conn, [args.tenant]) if args.tenant else (None,)
        letters = deadletter.list_dead_letters(conn, tenant_id, include_requeued=args.all)
    for d in letters:
        closed = ""
        if d.requeued_at:
            closed = f" [requeued {d.requeued_at:%Y-%m-%dT%H:%M:%SZ} by {d.requeued_by}]"
        if d.resolved_at:
            closed = (
                f" [resolved {d.resolved_at:%Y-%m-%dT%H:%M:%SZ} by {d.resolved_by}: {d.resolution}]"
            )
        _print(f"seq {d.seq} tenant {d.tenant_id} {refusal_line(d.op, d.reason)}{closed}")
    if not letters:
        _print("no dead letters")
    return EXIT_OK


def refusal_line(op: str, reason: str) -> str:
    """`op: reason`, without the op twice when the reason already starts with it."""
    return reason if reason.startswith((f"{op}:", f"{op} ")) else f"{op}: {reason}"


def cmd_deadletter_resolve(args: argparse.Namespace) -> int:
    with from_settings.connect() as conn:
        when = deadletter.resolve(conn, args.seq, args.by, args.reason)
    _print(f"resolved dead letter {args.seq} at {when:%Y-%m-%dT%H:%M:%SZ} by {args.by.strip()}")
    return EXIT_OK


def cmd_deadletter_requeue(args: argparse.Namespace) -> int:
    payload = json.loads(args.payload) if args.payload else None
    with from_settings.connect() as conn:
        try:
            new_id = deadletter.requeue(conn, args.seq, args.by, payload)
        except RequeueError as error:
            print(f"oml-lake: {error}", file=sys.stderr)
            return EXIT_USAGE
    _print(f"re-enqueued dead letter {args.seq} as outbox row {new_id}")
    return EXIT_OK


def _per_tenant(
    sub, name: str, help: str, func, *, json_help: str = "one JSON object per tenant"
) -> argparse.ArgumentParser:
    """A command over every tenant or the ones named, in text or JSON."""
    command = sub.add_parser(name, help=help)
    command.add_argument("--tenant", action="append", help="this tenant (repeatable; default all)")
    command.add_argument("--json", action="store_true", help=json_help)
    command.set_defaults(func=func)
    return command


def _cadence_option(command: argparse.ArgumentParser, what: str) -> None:
    command.add_argument(
        "--cadence-hours",
        type=float,
        default=None,
        help=f"{what} (default: OML_ERASURE_CADENCE_SECONDS, a day)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oml-lake", description=__doc__)
    parser.add_argument(
        "--debug",
        action="store_true",
        help="print the traceback under an error's one line (or set OML_DEBUG=1)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _register_db(sub)
    sub.add_parser("sequence", help="run the sequencer once").set_defaults(func=cmd_sequence)
    dr = sub.add_parser("drain", help="sequence and apply batches to the lake")
    dr.add_argument("--tenant", action="append", help="drain this tenant (repeatable)")
    dr.add_argument("--until-idle", action="store_true", help="pass after pass until nothing moves")
    dr.add_argument(
        "--max-batch", type=int, default=None, help="ops per tenant batch (default: OML_MAX_BATCH)"
    )
    dr.set_defaults(func=cmd_drain)
    _register_checks(sub)
    _register_deadletter(sub)
    maintenance_cli.register(sub)
    tenant_cli.register(sub)
    analytics_cli.register(sub)
    lake_tables_cli.register(sub)
    exporter_cli.register(sub)
    register_simulate(sub)
    return parser


def _register_db(sub: argparse._SubParsersAction) -> None:
    dbp = sub.add_parser("db", help="the Postgres schema").add_subparsers(
        dest="db_command", required=True
    )
    up = dbp.add_parser(
        "upgrade",
        help="apply the oml schema migrations (as the tables' owner: OML_PG_DSN names it here)",
    )
    up.add_argument(
        "--writer-role",
        action="append",
        metavar="ROLE",
        help="also create (or bring into line) ROLE, the login role the lake-writer's OML_PG_DSN "
        "should name: no privileges of its own, member of oml_lake_tenant and oml_lake_cross; "
        "password from OML_WRITER_PASSWORD when set (repeatable)",
    )
    up.set_defaults(func=cmd_db_upgrade)


def _register_checks(sub: argparse._SubParsersAction) -> None:
    """The commands that judge a tenant's lake: erasure-evidence, reconcile, doctor."""
    ev = _per_tenant(
        sub,
        "erasure-evidence",
        "whether erased bodies left the lake in time",
        cmd_erasure_evidence,
        json_help="one JSON object per tenant, per erased version",
    )
    _cadence_option(ev, "maintenance cadence allowed on top of the bound")
    rc = _per_tenant(
        sub,
        "reconcile",
        "every reconciler check of the lake against itself and the outbox",
        cmd_reconcile,
    )
    rc.add_argument("--samples", type=int, default=5, help="findings shown per failed check")
    dc = _per_tenant(sub, "doctor", "one screen per tenant: what needs an operator", cmd_doctor)
    _cadence_option(dc, "maintenance cadence: an erasure within this of its deadline is at risk")
    dc.add_argument(
        "--lag-seconds",
        type=float,
        default=DEFAULT_LAG_LIMIT.total_seconds(),
        help="drain lag beyond which an operator is needed",
    )


def _register_deadletter(sub: argparse._SubParsersAction) -> None:
    dl = sub.add_parser("deadletter", help="refused ops").add_subparsers(
        dest="dl_command", required=True
    )
    ls = dl.add_parser("list", help="list dead letters")
    ls.add_argument("--tenant")
    ls.add_argument("--all", action="store_true", help="include re-enqueued and resolved ones")
    ls.set_defaults(func=cmd_deadletter_list)
    rq = dl.add_parser("requeue", help="re-enqueue a dead letter after a fix")
    rq.add_argument("seq", type=int)
    rq.add_argument("--by", default=getpass.getuser(), help="who re-enqueues (recorded)")
    rq.add_argument("--payload", help="a corrected payload (JSON); default: the stored one")
    rq.set_defaults(func=cmd_deadletter_requeue)
    rs = dl.add_parser(
        "resolve",
        help="close a dead letter that is wrong for good (kept for audit; the op stays refused)",
    )
    rs.add_argument("seq", type=int)
    rs.add_argument("--reason", required=True, help="why it is closed (recorded)")
    rs.add_argument("--by", default=getpass.getuser(), help="who resolves it (recorded)")
    rs.set_defaults(func=cmd_deadletter_resolve)


def _debug_asked() -> bool:
    """--debug on the command line or OML_DEBUG, before the arguments are parsed."""
    try:
        return "--debug" in sys.argv[1:] or DEBUG.read()
    except Exception:
        return True


def _debugging(args: argparse.Namespace) -> bool:
    try:
        return args.debug or DEBUG.read()
    except Exception:  # a bad OML_DEBUG must not hide the error being reported
        return True


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except OutputClosed:
        # Nothing more can be written there; keep the interpreter from failing on it again.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OUTPUT_CLOSED
    except Exception as error:
        line, code = describe(error)
        if _debugging(args):
            traceback.print_exception(error)
        print(f"oml-lake: {line}", file=sys.stderr, flush=True)
        return code


def entry() -> NoReturn:
    """`oml-lake` as a command: `main`, then out of the process without the interpreter's
    teardown. Native thread pools (Arrow's, delta-rs's) can still be winding down when Python
    finalizes, and a finished command then aborted now and then with "terminate called without
    an active exception" (SIGABRT, exit -6; delta-io/delta-rs#2184): a scheduler would have
    counted a command that did all its work as failed. All work is done when `main` returns:
    every commit is in the lake, every connection closed. Output is flushed first (ADR 0042)."""
    if not _debug_asked():
        # psycopg warns on stderr when a transaction interrupted by Ctrl-C or SIGTERM cannot be
        # rolled back ("error ignored in rollback"; the server rolls it back when the session
        # ends): the command's own line already says what committed. --debug keeps it.
        logging.getLogger("psycopg").setLevel(logging.ERROR)
    with native_panics_filtered(not _debug_asked()):
        code: int | str | None
        try:
            code = main()
        except SystemExit as stop:  # argparse's usage errors, --help
            code = stop.code
        except KeyboardInterrupt:
            code = EXIT_INTERRUPTED
        except BaseException:
            traceback.print_exc()
            code = EXIT_INTERNAL
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # a SystemExit with a message, as the interpreter does
        code = EXIT_FINDINGS
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code or EXIT_OK)
