"""A drain's memory: giving freed memory back between batches, and a batch cap that keeps the
process's peak resident memory under a budget (ADR 0034).

A batch's peak is the process's baseline (libraries, open tables, the tables' own growth) plus
what the batch holds while it commits: its Arrow columns and Python ops, the working rows, the
next batch read ahead. The second part grows with the batch's ops, the first with the tables, so
no fixed cap suits every backlog. The governor measures the peak each large enough batch reached
(Linux: `VmHWM`, reset before the batch through `/proc/self/clear_refs`) and sets the next
batch's cap from it: a backlog drains in batches as large as the budget lets the process hold.
Where the kernel offers no peak reading the cap stays as configured.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import re
from dataclasses import dataclass

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
_malloc_trim = getattr(_libc, "malloc_trim", None)  # glibc only

MIB = 2**20


def release_memory() -> None:
    """Collect reference cycles (some hold Arrow buffers until the cyclic collector runs) and
    return glibc's free heap pages to the system (delta-rs's and the fold's allocations are
    freed into heaps glibc keeps otherwise). Without it a long drain's resident memory creeps up
    batch after batch though nothing stays referenced (bench/RESULTS.md, the 1M-op backlog)."""
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


def next_cap(
    cap: int, *, ops: int, before_mib: float, peak_mib: float, budget_mib: float, least: int
) -> int:
    """The cap after a batch of `ops` ops under `cap` that raised the resident memory from
    `before_mib` to `peak_mib`. Over the budget: the batch's size scaled down by the share of
    its growth the budget had room for (between a half and nine tenths of it). Well under it
    (below 85 %) after a full batch: a quarter more. Otherwise unchanged."""
    if peak_mib > budget_mib:
        grown = peak_mib - before_mib
        share = (budget_mib - before_mib) / grown if grown > 0 else 0.0
        return max(least, int(min(cap, ops) * min(max(share, 0.5), 0.9)))
    if ops >= cap and peak_mib < 0.85 * budget_mib:
        return int(cap * 1.25) + 1
    return cap


@dataclass
class MemoryGovernor:
    """Caps a drain's batches so its process stays under `budget_mib` of resident memory (None:
    no cap beyond the configured one). Use: `cap(most)` before a batch, `observed(ops)` after.

    The peak a batch reaches is measured, not predicted: the cap starts at half the configured
    one, grows while full batches stay well under the budget and shrinks after a batch that
    went over it (`next_cap`), so a long backlog drains in batches as large as the budget lets
    the process hold, whatever the tables' own growth does to the baseline. It never shrinks
    below a tenth of the configured cap (`floor_share`, at least `least` ops), so a budget the
    process cannot keep does not shrink batches to where their fixed cost is all they cost."""

    budget_mib: float | None
    # A batch smaller than this tells too little about the memory a batch takes.
    sample_ops: int = 2_000
    # The smallest cap the governor sets: `least` ops, or `floor_share` of the configured cap
    # when that is more. Below it a batch's fixed cost outweighs the memory a smaller batch
    # saves: a retract MERGE rewrites every file its rows touch, however few the rows, and its
    # peak follows the table more than the batch (bench/RESULTS.md, 3 Dec: a budget under the
    # process's working baseline took a 1M-op drain down to 1,000-op batches at ~70 ops/s).
    least: int = 1_000
    floor_share: float = 0.1
    current: int | None = None
    _before: float | None = None
    _measuring: bool = False
    _floor: int = 1_000

    def cap(self, most: int) -> int:
        """The cap for the next batch (at most `most`), and a fresh peak reading for it."""
        if self.budget_mib is None:
            return most
        self._measuring = reset_peak()
        self._before = resident_mib() if self._measuring else None
        if self._before is None:
            return most
        self._floor = min(most, max(self.least, int(most * self.floor_share)))
        if self.current is None:
            self.current = max(self._floor, most // 2)
        if self._before >= self.budget_mib:
            # Already over before the batch: halve the cap, down to the floor.
            self.current = max(self._floor, self.current // 2)
        self.current = min(self.current, most)
        return max(2, self.current)

    def observed(self, ops: int) -> None:
        """The batch just drained had `ops` ops: adjust the cap to the peak it reached."""
        measuring, self._measuring = self._measuring, False
        if not measuring or self._before is None or self.current is None:
            return
        if ops < self.sample_ops:
            return
        peak = peak_mib()
        if peak is not None and self.budget_mib is not None:
            self.current = next_cap(
                self.current,
                ops=ops,
                before_mib=self._before,
                peak_mib=peak,
                budget_mib=self.budget_mib,
                least=self._floor,
            )
