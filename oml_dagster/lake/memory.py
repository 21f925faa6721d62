"""A drain's memory: giving freed memory back between batches, and a batch cap that keeps the
process's peak resident memory under a budget (ADR 0034).

A batch's peak is the process's baseline (libraries, open tables, the tables' own growth) plus
what the batch holds while it commits: its Arrow columns and Python ops, the working rows, the
next batch read ahead. The second part grows with the batch's ops. So after each large enough
batch the governor measures the peak it reached (Linux: `VmHWM`, reset before the batch through
`/proc/self/clear_refs`), takes the memory per op it cost, and caps the next batch at what the
budget leaves above the baseline. A backlog then drains in batches as large as the budget allows,
whatever its length; where the kernel offers no peak reading the cap stays as configured.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import re
from collections import deque
from dataclasses import dataclass, field

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
_malloc_trim = getattr(_libc, "malloc_trim", None)  # glibc only

MIB = 2**20


def release_memory() -> None:
    """Collect reference cycles (some hold Arrow buffers until the cyclic collector runs) and
    return glibc's free heap pages to the system (delta-rs's and the fold's allocations are
    freed into heaps glibc keeps otherwise). Without it a long drain's resident memory creeps up
    batch after batch though nothing stays referenced (bench/RESULTS.md, issue 10 target 3)."""
    gc.collect()
    if _malloc_trim is not None:
        _malloc_trim(0)


def _status_mib(field_name: str) -> float | None:
    try:
        with open("/proc/self/status") as status:
            text = status.read()
    except OSError:
        return None
    found = re.search(rf"^{field_name}:\s+(\d+) kB", text, re.MULTILINE)
    return int(found.group(1)) / 1024 if found else None


def resident_mib() -> float | None:
    """The process's resident memory now (None where /proc does not say)."""
    return _status_mib("VmRSS")


def peak_mib() -> float | None:
    """The process's peak resident memory since the last `reset_peak` (or its start)."""
    return _status_mib("VmHWM")


def reset_peak() -> bool:
    """Start a new peak reading (Linux >= 4.0); False where that cannot be done."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def batch_cap(
    budget_mib: float, baseline_mib: float, mib_per_op: float, most: int, least: int
) -> int:
    """The ops a batch may take so that baseline + ops × cost stays within the budget, between
    `least` and `most` (a budget already spent by the baseline still drains, `least` at a time)."""
    room = budget_mib - baseline_mib
    if room <= 0:
        return least
    if mib_per_op <= 0:
        return most
    return max(least, min(most, int(room / mib_per_op)))


@dataclass
class MemoryGovernor:
    """Caps a drain's batches so its process stays under `budget_mib` of resident memory (None:
    no cap beyond the configured one). Use: `cap(most)` before a batch, `observed(ops)` after."""

    budget_mib: float | None
    # A batch smaller than this tells too little about the cost per op to be measured.
    sample_ops: int = 2_000
    # The smallest cap the governor sets.
    least: int = 1_000
    # The costs per op of the last batches measured; the largest is used (ops differ in weight).
    costs: deque[float] = field(default_factory=lambda: deque(maxlen=4))
    _before: float | None = None
    _measuring: bool = False

    def cap(self, most: int) -> int:
        """The cap for the next batch (at most `most`), and a fresh peak reading for it."""
        if self.budget_mib is None:
            return most
        self._measuring = reset_peak()
        self._before = resident_mib() if self._measuring else None
        if not self.costs or self._before is None:
            return most
        return batch_cap(self.budget_mib, self._before, max(self.costs), most, self.least)

    def observed(self, ops: int) -> None:
        """The batch just drained had `ops` ops: learn what each cost at the peak."""
        if not self._measuring or self._before is None or ops < self.sample_ops:
            return
        peak = peak_mib()
        if peak is not None:
            self.costs.append(max(peak - self._before, 0.0) / ops)
        self._measuring = False
