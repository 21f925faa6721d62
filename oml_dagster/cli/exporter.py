"""`oml-lake exporter --listen 127.0.0.1:9464`: the metrics endpoint Prometheus scrapes
(`oml_dagster.lake.audit.metrics`, ADR 0065). Serves `/metrics` (OpenMetrics when the scraper
asks for it, Prometheus text otherwise) until SIGTERM or Ctrl-C. PostgreSQL and the lake may come
and go while it runs: it serves its own health instead of stopping. Bad settings stop it before
it listens, with one line."""

from __future__ import annotations

import argparse
import ipaddress
import signal
import sys
import threading
from typing import Any

import psycopg

from oml_dagster import from_settings
from oml_dagster.lake.faults import EXIT_OK, EXIT_USAGE
from oml_dagster.setting_errors import InvalidSetting
from oml_dagster.settings import EXPORTER_LAKE_REFRESH_SECONDS, FRESHNESS_BOUND_SECONDS

from .output import out as _print

DEFAULT_LISTEN = "127.0.0.1:9464"
# A scrape must answer within Prometheus's timeout (10 s by default): a server that drops
# packets holds a connection attempt no longer than this, a statement no longer than the other.
CONNECT_TIMEOUT_SECONDS = 3
STATEMENT_TIMEOUT_MS = 5000


def listen_address(text: str) -> tuple[str, int]:
    """HOST:PORT as (host, port); ValueError naming what is wrong."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen {text!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"--listen {text!r}: {host!r} is not an IP address (e.g. {DEFAULT_LISTEN})"
        ) from None
    return host, int(port)


def cmd_exporter(args: argparse.Namespace) -> int:
    # Here, not at the top: every other command would pay for importing prometheus-client.
    from prometheus_client import CollectorRegistry

    from oml_dagster.lake.audit.metrics import (
        ExporterConfig,
        LakeCache,
        LakeMetrics,
        LakeRefresher,
        MetricsServer,
    )

    try:
        host, port = listen_address(args.listen)
    except ValueError as error:
        print(f"oml-lake: {error}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    dsn = from_settings.dsn()
    psycopg.conninfo.conninfo_to_dict(dsn)  # a malformed OML_PG_DSN stops it here
    config = ExporterConfig(
        lag_bound_seconds=FRESHNESS_BOUND_SECONDS.read(),
        cadence=from_settings.erasure_cadence(),
        lake_refresh_seconds=EXPORTER_LAKE_REFRESH_SECONDS.read(),
    )
    lake = from_settings.named_lake().with_store_defaults()

    def connect() -> psycopg.Connection:
        return psycopg.connect(
            dsn,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
        )

    cache = LakeCache(lake, cadence=config.cadence)
    metrics = LakeMetrics(connect, cache, config)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    try:
        server = MetricsServer(registry, cache, host, port).start()
    except OSError as error:
        raise InvalidSetting(
            f"--listen {args.listen}: cannot listen there ({error.strerror or error}); pick a "
            "free port"
        ) from None
    refresher = LakeRefresher(metrics, connect, config.lake_refresh_seconds)
    refresher.start()
    stopping = threading.Event()

    def stop(*_: Any) -> None:
        stopping.set()

    previous = signal.signal(signal.SIGTERM, stop)
    _print(f"oml-lake exporter: serving http://{args.listen}/metrics")
    try:
        while not stopping.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()
        refresher.stop()
        metrics.close()
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    ex = sub.add_parser(
        "exporter",
        help="serve per-tenant metrics for Prometheus (OpenMetrics) from PostgreSQL and the lake",
    )
    ex.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        help=f"IP:PORT to serve /metrics on (default {DEFAULT_LISTEN}: loopback only)",
    )
    ex.set_defaults(func=cmd_exporter)
