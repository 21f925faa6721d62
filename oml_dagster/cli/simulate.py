"""`oml-lake simulate`: write what the OML service would write into the Postgres at OML_PG_DSN
(DESIGN §2), as a whole workload or as a paced stream."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from oml_dagster import from_settings
from oml_dagster.lake.faults import EXIT_FINDINGS, EXIT_OK, EXIT_PERMANENT, EXIT_USAGE

if TYPE_CHECKING:
    from oml_dagster.simulate.runner import RunConfig, RunReport
    from oml_dagster.simulate.workload import WorkloadConfig

from .output import out as _print

_DESCRIPTION = """\
Create tenants (api key, tenant policy), a workarea tree per tenant and a lifecycle per claim
(promotions of versions 1..n, ratified edges, demotes, erases with crypto-shred, reassigns
into held and back, simulation runs ending with and without taint closure, area status and
crew changes, re-parents, validations), each act a signed, hash-chained journal event plus its
outbox ops, written by concurrent writers. The same --seed writes the same workload.
Without --rate the whole workload is written; with --rate it is a paced stream for --duration
seconds. Needs the oml schema (`oml-lake db upgrade`)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `simulate` subcommand to the `oml-lake` parser."""
    sim = subparsers.add_parser(
        "simulate",
        help="write a realistic, verifiable producer workload into Postgres",
        description=_DESCRIPTION,
    )
    sim.add_argument("--tenants", type=int, default=3, help="tenants to create (default 3)")
    sim.add_argument(
        "--claims", type=int, default=100, help="claims per tenant, each a lifecycle (default 100)"
    )
    sim.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    sim.add_argument("--rate", type=float, help="stream at this many outbox ops per second instead")
    sim.add_argument("--duration", type=float, help="seconds to stream with --rate (default 60)")
    sim.add_argument(
        "--writers", type=int, default=4, help="concurrent writer connections (default 4)"
    )
    sim.add_argument(
        "--bad-ratio",
        type=float,
        default=0.0,
        help="chance that an act also carries one malformed or forbidden op (default 0)",
    )
    sim.add_argument(
        "--batch",
        type=int,
        help="consecutive acts of a tenant per transaction (default 64; 1 with --rate)",
    )
    sim.add_argument(
        "--verify",
        action="store_true",
        help="afterwards verify the written tenants' chains, bodies, erasures and areas",
    )
    sim.add_argument(
        "--depart",
        type=int,
        default=0,
        metavar="N",
        help="afterwards the first N tenants depart (a tenant.departed act, departed_at set)",
    )
    sim.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    sim.set_defaults(func=cmd_simulate)


def _report(report: RunReport, workload: WorkloadConfig, config: RunConfig) -> None:
    mode = (
        f"stream at {config.rate:g} ops/s for up to {config.duration:g} s"
        if config.rate
        else "whole workload"
    )
    _print(
        f"simulate ({mode}, seed {workload.seed}): {len(report.tenants)} tenants, "
        f"{report.claims} claims, {report.acts} acts, {report.rows} ops in "
        f"{report.elapsed:.2f} s = {report.ops_per_second:,.0f} ops/s; "
        f"{report.transactions} transactions by {config.writers} writers"
    )
    if config.rate:
        ending = "workload done" if report.exhausted else "duration reached"
        _print(f"  stream ended: {ending}")
    _print("  ops: " + ", ".join(f"{op} {n}" for op, n in sorted(report.ops.items())))
    if report.faults:
        total = sum(report.faults.values())
        detail = ", ".join(f"{k} {n}" for k, n in sorted(report.faults.items()))
        _print(f"  bad ops: {total} ({detail})")
    _print(
        f"  concurrency: {report.early_xid} transactions took their xid before waiting for "
        f"the chain lock, {report.long_open} held open, {report.late_commits} commits came "
        "after a commit with a higher xid"
    )
    if len(report.tenants) <= 20:
        for tenant_id in report.tenants:
            _print(f"  tenant {tenant_id}")


def cmd_simulate(args: argparse.Namespace) -> int:
    # Imported here: the producer's modules are paid for by `simulate` alone.
    from oml_dagster.simulate import verify
    from oml_dagster.simulate.runner import RunConfig, SimulationError, run
    from oml_dagster.simulate.workload import WorkloadConfig

    if args.duration is not None and args.rate is None:
        print("oml-lake simulate: --duration needs --rate", file=sys.stderr)
        return EXIT_USAGE
    try:
        workload = WorkloadConfig(
            tenants=args.tenants, claims=args.claims, seed=args.seed, bad_ratio=args.bad_ratio
        )
        config = RunConfig(
            writers=args.writers,
            acts_per_tx=args.batch,
            rate=args.rate,
            duration=(args.duration or 60.0) if args.rate else None,
            progress=not args.no_progress,
        )
    except ValueError as error:
        print(f"oml-lake simulate: {error}", file=sys.stderr)
        return EXIT_USAGE
    # The first contact, bounded (ADR 0070), before the producer's own connections.
    from_settings.connect().close()
    try:
        report = run(from_settings.dsn(), workload, config)
    except SimulationError as error:
        print(f"oml-lake simulate: {error}", file=sys.stderr)
        return EXIT_PERMANENT
    _report(report, workload, config)
    if args.depart:
        from oml_dagster.simulate import acts, producer

        with from_settings.connect() as conn:
            for tenant_id in report.tenants[: args.depart]:
                acts.depart(conn, producer.load_tenant(conn, tenant_id))
                _print(f"  departed tenant {tenant_id}")
    if not args.verify:
        return EXIT_OK
    with from_settings.connect() as conn:
        results = verify.verify(conn, report.tenants)
    for result in results:
        _print("  verify " + result.summary())
        for problem in result.errors:
            _print(f"    {problem}")
    return EXIT_OK if all(r.ok for r in results) else EXIT_FINDINGS
