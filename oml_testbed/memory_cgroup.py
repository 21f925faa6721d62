"""A memory-limited cgroup for one command, so the kernel's own OOM killer ends it (the OOM test
and the memory benchmark's limit check). cgroup v2 (`memory.max`, `memory.events`) where the
unified hierarchy holds the memory controller, else v1 (`memory.limit_in_bytes`,
`memory.oom_control`). Needs root (or a delegated subtree); `memory_limited` raises
`CgroupUnavailable` where neither is writable, for the caller to skip."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

V2_ROOT = Path("/sys/fs/cgroup")
V1_MEMORY = Path("/sys/fs/cgroup/memory")


class CgroupUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class MemoryCgroup:
    path: Path
    version: int

    def enter(self) -> None:
        """Move the calling process into the cgroup (a `preexec_fn`: the child, before exec)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer ended in this cgroup."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def peak_bytes(self) -> int:
        """The cgroup's highest memory use (v2: memory.peak where the kernel has it)."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        path = self.path / name
        return int(path.read_text()) if path.exists() else 0


def _v2_available() -> bool:
    controllers = V2_ROOT / "cgroup.controllers"
    return controllers.exists() and "memory" in controllers.read_text().split()


@contextlib.contextmanager
def memory_limited(limit_bytes: int) -> Iterator[MemoryCgroup]:
    """A fresh cgroup whose processes may use at most `limit_bytes` of memory (no swap), removed
    after (its processes must have ended)."""
    name = f"oml-test-{uuid.uuid4().hex[:10]}"
    if _v2_available():
        group = MemoryCgroup(V2_ROOT / name, 2)
        limits = {"memory.max": str(limit_bytes), "memory.swap.max": "0"}
    elif (V1_MEMORY / "memory.limit_in_bytes").exists():
        group = MemoryCgroup(V1_MEMORY / name, 1)
        limits = {"memory.limit_in_bytes": str(limit_bytes)}
    else:
        raise CgroupUnavailable("no cgroup memory controller on this machine")
    try:
        group.path.mkdir()
    except OSError as error:
        raise CgroupUnavailable(f"cannot create {group.path}: {error}") from error
    try:
        for key, value in limits.items():
            target = group.path / key
            if target.exists():
                target.write_text(value)
        yield group
    finally:
        for _ in range(50):  # the last process may still be leaving
            try:
                group.path.rmdir()
                break
            except OSError:
                time.sleep(0.1)
