"""A private PostgreSQL cluster on a free loopback port, which the fault tests and the fault
benchmark restart (`pg_ctl restart -m immediate|fast`) under a running drain; the shared server
on 5432 is never touched. The server's binaries come from the machine's PostgreSQL package, run
as the `postgres` OS user when the caller is root."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from oml_testbed.s3_server import _free_loopback_port

TIMEOUT_S = 60


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        raise FileNotFoundError("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
    return Path(found[-1]).parent


@dataclass
class Cluster:
    data: Path
    port: int
    log: Path
    bindir: Path

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _as_owner(self, *command: str) -> subprocess.CompletedProcess:
        argv = [str(self.bindir / command[0]), *command[1:]]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=True)

    def start(self) -> None:
        self._as_owner("pg_ctl", "start", "-w", "-D", str(self.data), "-l", str(self.log))

    def stop(self, mode: str = "fast") -> None:
        self._as_owner("pg_ctl", "stop", "-w", "-m", mode, "-D", str(self.data))

    def restart(self, mode: str) -> None:
        """`pg_ctl restart -m MODE` (immediate: a crash and recovery; fast: a clean shutdown)."""
        self._as_owner(
            "pg_ctl", "restart", "-w", "-m", mode, "-D", str(self.data), "-l", str(self.log)
        )

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)


@contextlib.contextmanager
def private_cluster() -> Iterator[Cluster]:
    bindir = _bindir()
    root = Path(tempfile.mkdtemp(prefix="oml-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    cluster = Cluster(root / "data", _free_loopback_port(), root / "server.log", bindir)
    try:
        cluster._as_owner("initdb", "-D", str(cluster.data), "-A", "trust", "-U", "postgres")
        with open(cluster.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nlisten_addresses = '127.0.0.1'\nport = {cluster.port}\n"
                # fsync off survives a server crash (the kernel keeps the writes); an
                # asynchronous commit would not: a restart -m immediate could lose verdicts the
                # lake already acted on, which production never configures.
                f"unix_socket_directories = '{root}'\nfsync = off\n"
            )
        cluster.start()
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            cluster.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
