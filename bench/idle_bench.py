"""`oml-lake drain --until-idle` end to end against the pipeline's floor (issue 35, target 3).

N journal.event ops of one tenant (signed, hash-chained, as the producer writes them) are
COPYed into the outbox, unsequenced, as a backlog finds the command. Then, in the same run:

- floor: PostgreSQL hands the very rows out as Arrow in one ADBC query (the jsonb fields
  extracted, the base64 ones decoded, the instant parsed, server-side; the outbox id's order as
  the seq), and `write_deltalake` writes them as bronze: what any writer must at least do;
- command: `oml-lake drain --until-idle` in a fresh process, timed from its start to its exit:
  interpreter start and imports, the stable-prefix cut, the drain, as a user runs it.

Both write into fresh local directories. `--baseline-source DIR` runs the command again, on a
fresh copy of the same backlog (a database template), with the code of another checkout (on
PYTHONPATH), alternating with this checkout's in every round. Prints each time, its rate and
the ratio, and with `--json` writes them to a file.

    .venv/bin/python bench/idle_bench.py --events 200000 --repeats 3 --baseline-source /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _support import Snapshot, child_env, code_root, fresh_database, machine  # noqa: E402
from bronze_bench import write_events  # noqa: E402

from oml_dagster.lake.model.tables import BRONZE_EVENTS, writer_properties  # noqa: E402
from oml_dagster.simulate import producer  # noqa: E402

_B64 = ("prev_hash", "hash", "sig", "signed_bytes")
_TEXT = (
    "event_id",
    "event_type",
    "principal",
    "api_key_id",
    "artifact_id",
    "workarea_id",
    "simulation_id",
    "provenance",
)

# The bronze rows straight from the outbox: every field the spec's bronze.events holds, typed.
FLOOR_SQL = f"""
SELECT o.tenant_id::text AS tenant_id,
       (o.payload ->> 'journal_seq')::bigint AS journal_seq,
       {", ".join(f"o.payload ->> '{c}' AS {c}" for c in _TEXT)},
       (o.payload ->> 'at')::timestamptz AS at,
       ((o.payload ->> 'at')::timestamptz AT TIME ZONE 'UTC')::date AS event_date,
       {", ".join(f"decode(o.payload ->> '{c}', 'base64') AS {c}" for c in _B64)},
       (o.payload -> 'payload')::text AS payload,
       (o.payload ->> 'version')::bigint AS version,
       row_number() OVER (ORDER BY o.id) AS outbox_seq
FROM oml.outbox o WHERE o.tenant_id = $1::uuid ORDER BY o.id
"""


def floor(dsn: str, tenant_id: str, root: str) -> tuple[float, int]:
    """One ADBC query to Arrow, cast to bronze's schema, one `write_deltalake`; seconds, rows."""
    import adbc_driver_postgresql.dbapi as adbc
    import pyarrow as pa
    from deltalake import write_deltalake

    started = time.perf_counter()
    with adbc.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(FLOOR_SQL, (tenant_id,))
        data = cur.fetch_arrow_table()
    schema = BRONZE_EVENTS.schema
    data = pa.table(
        [data[f.name].cast(f.type) for f in schema], schema=schema
    )  # names and types as the spec's
    write_deltalake(
        root,
        data,
        partition_by=list(BRONZE_EVENTS.partition_by),
        writer_properties=writer_properties(BRONZE_EVENTS),
    )
    return time.perf_counter() - started, data.num_rows


def command(dsn: str, lake_uri: str, source: str) -> tuple[float, str]:
    """`oml-lake drain --until-idle` in a new process running the code of checkout `source`:
    wall seconds from spawn to exit, stdout."""
    env = child_env(source, OML_PG_DSN=dsn, OML_LAKE_URI=lake_uri)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "oml_dagster.cli", "drain", "--until-idle"],
        env=env,
        cwd=source,  # `python -m` puts the working directory ahead of PYTHONPATH
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"oml-lake drain exited {done.returncode}: {done.stderr[-2000:]}")
    return wall, done.stdout


def import_seconds(source: str) -> float:
    """What `oml-lake` pays before its first statement: the interpreter and the command's
    imports (`--help` parses nothing else); the best of three."""
    env = child_env(source)
    times = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "oml_dagster.cli", "drain", "--help"],
            capture_output=True,
            check=True,
            env=env,
            cwd=source,
        )
        times.append(time.perf_counter() - started)
    return min(times)


def bronze_rows(lake_uri: str, tenant_id: str) -> int:
    from deltalake import DeltaTable

    uri = os.path.join(lake_uri, tenant_id, BRONZE_EVENTS.relpath)
    return DeltaTable(uri).to_pyarrow_table(columns=["journal_seq"]).num_rows


def one_round(events: int, sources: dict[str, str]) -> dict:
    result: dict = {"events": events}
    with fresh_database("oml_idle") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            keys = producer.create_tenant(conn)
            write_events(conn, keys, events)
        snapshot = Snapshot(dsn)  # vacuumed and analyzed, as autovacuum leaves a COPY
        try:
            with tempfile.TemporaryDirectory() as tmp:
                floor_s, rows = floor(dsn, keys.tenant_id, os.path.join(tmp, "floor"))
                assert rows == events, (rows, events)
                result["floor_s"] = round(floor_s, 3)
                result["floor_rate"] = round(events / floor_s)
                for name, source in sources.items():
                    snapshot.restore()
                    lake_uri = os.path.join(tmp, f"lake-{name}")
                    wall, out = command(dsn, lake_uri, source)
                    assert bronze_rows(lake_uri, keys.tenant_id) == events
                    result[name] = {
                        "command_s": round(wall, 3),
                        "command_rate": round(events / wall),
                        "ratio": round(floor_s / wall, 3),
                        "stdout_tail": out.strip().splitlines()[-2:],
                    }
        finally:
            snapshot.drop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--baseline-source", help="another checkout, run in the same rounds")
    parser.add_argument("--json", help="write the rounds here")
    args = parser.parse_args()
    print(machine())
    # Each checkout's command runs its own code, checked by importing it there (code_root).
    sources = {"this": code_root(None)}
    if args.baseline_source:
        sources = {"baseline": code_root(args.baseline_source), **sources}
    startup = {name: round(import_seconds(src), 3) for name, src in sources.items()}
    for name, seconds in startup.items():
        print(f"{name} ({sources[name]}): oml-lake drain --help, best of 3: {seconds:.2f} s")
    rounds = []
    for n in range(args.repeats):
        r = one_round(args.events, sources)
        rounds.append(r)
        print(f"round {n + 1}: floor {r['floor_s']:.2f} s = {r['floor_rate']:,} events/s")
        for name in sources:
            c = r[name]
            print(
                f"    {name}: oml-lake drain --until-idle {c['command_s']:.2f} s = "
                f"{c['command_rate']:,} events/s; ratio {c['ratio']:.2f}x"
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"machine": machine(), "sources": sources, "startup_s": startup, "rounds": rounds},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
