"""What a Delta table's root holds, read from storage: its data files, the entries of its
`_delta_log` (commits, checkpoints, checksums, compacted logs) and the tombstones the log keeps.
Maintenance, the erasure evidence and the doctor read the log through this one module.

Log file names (Delta protocol, "Delta Log Entries" and "Checkpoints"), `v` a 20-digit version:
- `v.json`: a commit; `v.crc`: its checksum; `a.b.compacted.json`: commits a..b compacted.
- `v.checkpoint.parquet`: a single-file checkpoint.
- `v.checkpoint.o.p.parquet` (`o`, `p` 10 digits): part `o` of a `p`-part checkpoint. A multi-part
  checkpoint cannot be written atomically, so it counts only once every part is there.
- `v.checkpoint.<uuid>.json|parquet`: a V2 checkpoint (its sidecars sit in `_sidecars/`).
- `_last_checkpoint`: a hint naming the latest checkpoint (version, and `parts` when multi-part).
  Writers update it after the checkpoint, so it can lag; the listing is the authority here.

Tombstones are read from every commit, compacted log, checkpoint part and sidecar still listed.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable

LOG_DIR = "_delta_log"
LAST_CHECKPOINT = "_last_checkpoint"
SIDECARS = "_sidecars"

COMMIT, CHECKSUM, COMPACTED, CHECKPOINT = "commit", "checksum", "compacted", "checkpoint"

_V = r"(\d{20})"
_NAMES = (
    (re.compile(rf"^{_V}\.json$"), COMMIT),
    (re.compile(rf"^{_V}\.crc$"), CHECKSUM),
    (re.compile(rf"^{_V}\.{_V}\.compacted\.json$"), COMPACTED),
    (re.compile(rf"^{_V}\.checkpoint\.parquet$"), CHECKPOINT),
    (re.compile(rf"^{_V}\.checkpoint\.(\d{{10}})\.(\d{{10}})\.parquet$"), CHECKPOINT),
    (re.compile(rf"^{_V}\.checkpoint\.[0-9a-fA-F-]{{36}}\.(?:json|parquet)$"), CHECKPOINT),
)


@dataclass(frozen=True)
class LogFile:
    """One entry of `_delta_log`. `version` is the version it records, or for a compacted log the
    last one it covers; `part`/`parts` number the parts of a multi-part checkpoint (1/1 else)."""

    name: str
    kind: str
    version: int
    part: int = 1
    parts: int = 1


def parse_log_name(name: str) -> LogFile | None:
    """The log entry a file name in `_delta_log` is, or None (`_last_checkpoint`, temporary files,
    sidecars and anything else)."""
    for pattern, kind in _NAMES:
        match = pattern.match(name)
        if match is None:
            continue
        if kind == COMPACTED:
            return LogFile(name, kind, int(match[2]))
        if kind == CHECKPOINT and match.lastindex == 3:
            part, parts = int(match[2]), int(match[3])
            if not 1 <= part <= parts:
                return None
            return LogFile(name, kind, int(match[1]), part, parts)
        return LogFile(name, kind, int(match[1]))
    return None


def complete_checkpoints(names: Iterable[str]) -> list[int]:
    """Versions with a complete checkpoint among `names` (entries of `_delta_log`), oldest first:
    a single-file or V2 checkpoint, or every part of a multi-part one."""
    parts: dict[tuple[int, int], set[int]] = {}
    for name in names:
        entry = parse_log_name(name)
        if entry is not None and entry.kind == CHECKPOINT:
            parts.setdefault((entry.version, entry.parts), set()).add(entry.part)
    return sorted(
        {version for (version, count), seen in parts.items() if seen == set(range(1, count + 1))}
    )


@dataclass(frozen=True)
class Listing:
    """Every file under a table's root: data files (path relative to the root -> size and mtime)
    and the entries of `_delta_log` (name inside it -> (size, mtime))."""

    data: dict[str, int]
    log: dict[str, tuple[int, dt.datetime | None]]
    data_mtime: dict[str, dt.datetime | None]

    def entries(self) -> list[LogFile]:
        """The log's entries this module recognises, by version and name."""
        found = (parse_log_name(n) for n in self.log)
        return sorted((e for e in found if e is not None), key=lambda e: (e.version, e.name))

    def commits(self) -> list[int]:
        """Versions whose commit file (`v.json`) is listed, oldest first."""
        return [e.version for e in self.entries() if e.kind == COMMIT]

    def checkpoints(self) -> list[int]:
        return complete_checkpoints(self.log)

    def last_checkpoint(self) -> int | None:
        found = self.checkpoints()
        return found[-1] if found else None


def list_files(fs: pafs.FileSystem) -> Listing:
    """Every file under a table's root (`fs`, e.g. `Lake.filesystem(uri)`), data and log."""
    data: dict[str, int] = {}
    data_mtime: dict[str, dt.datetime | None] = {}
    log: dict[str, tuple[int, dt.datetime | None]] = {}
    for info in fs.get_file_info(pafs.FileSelector("", recursive=True)):
        if info.type != pafs.FileType.File:
            continue
        path = info.path.lstrip("/")
        if path.startswith(f"{LOG_DIR}/"):
            log[path[len(LOG_DIR) + 1 :]] = (info.size or 0, info.mtime)
        else:
            data[path] = info.size or 0
            data_mtime[path] = info.mtime
    return Listing(data, log, data_mtime)


def holds_commit(fs: pafs.FileSystem, version: int) -> bool:
    """Whether the log still has the commit entry of `version` (a table deleted under a reader
    that kept its state has not)."""
    return bool(fs.get_file_info(entry_path(commit_name(version))).type != pafs.FileType.NotFound)


def commit_name(version: int) -> str:
    """The name of the commit entry of `version` in `_delta_log`."""
    return f"{version:020d}.json"


def entry_path(name: str) -> str:
    """The path of a log entry or checkpoint, relative to the table root."""
    return f"{LOG_DIR}/{name}"


def entry_bytes(fs: pafs.FileSystem, name: str) -> bytes:
    """The raw bytes of a log entry or checkpoint part (the erasure evidence scans them for
    ciphertext)."""
    with fs.open_input_stream(entry_path(name)) as f:
        return bytes(f.read())


def log_names(fs: pafs.FileSystem) -> list[str]:
    """The names directly inside `_delta_log` (one listing of the log, none of the data)."""
    selector = pafs.FileSelector(LOG_DIR, allow_not_found=True, recursive=False)
    return [
        info.path.rsplit("/", 1)[-1]
        for info in fs.get_file_info(selector)
        if info.type == pafs.FileType.File
    ]


def last_checkpoint(fs: pafs.FileSystem) -> int | None:
    """The version of the latest complete checkpoint in the log, or None when there is none."""
    found = complete_checkpoints(log_names(fs))
    return found[-1] if found else None


@dataclass(frozen=True)
class CheckpointHint:
    """What `_delta_log/_last_checkpoint` says: the version and, for multi-part, the part count."""

    version: int
    parts: int | None = None


def checkpoint_hint(fs: pafs.FileSystem) -> CheckpointHint | None:
    """`_last_checkpoint` as written, or None when there is none."""
    path = entry_path(LAST_CHECKPOINT)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_file(path) as f:
        hint = json.loads(f.read())
    parts = hint.get("parts")
    return CheckpointHint(int(hint["version"]), int(parts) if parts is not None else None)


def live_files(table: DeltaTable) -> dict[str, int]:
    """The data files the table's version references: path -> size."""
    actions = pa.table(table.get_add_actions(flatten=True))
    return dict(
        zip(
            actions.column("path").to_pylist(),
            actions.column("size_bytes").to_pylist(),
            strict=True,
        )
    )


def tombstones(fs: pafs.FileSystem, names: Iterable[str]) -> dict[str, dt.datetime]:
    """When each data file was removed from the table (its tombstone's `deletionTimestamp`, the
    latest when there are several), from the log entries among `names`: commits, compacted logs,
    every part of every checkpoint, and sidecars. Paths are relative to the table root."""
    stamps: dict[str, int] = {}

    def note(remove: dict[str, Any] | None) -> None:
        if not remove or remove.get("path") is None or remove.get("deletionTimestamp") is None:
            return
        key = unquote(remove["path"])
        stamps[key] = max(stamps.get(key, 0), int(remove["deletionTimestamp"]))

    for name in names:
        path = entry_path(name)
        entry = parse_log_name(name)
        if name.startswith(f"{SIDECARS}/") and name.endswith(".parquet"):
            _parquet_removes(fs, path, note)
        elif entry is None or entry.kind == CHECKSUM:
            continue
        elif name.endswith(".parquet"):
            _parquet_removes(fs, path, note)
        else:
            with fs.open_input_stream(path) as f:
                for line in f.read().decode().splitlines():
                    if line.strip():
                        note(json.loads(line).get("remove"))
    return {p: dt.datetime.fromtimestamp(ms / 1000, dt.UTC) for p, ms in stamps.items()}


def _parquet_removes(
    fs: pafs.FileSystem, path: str, note: Callable[[dict[str, Any] | None], None]
) -> None:
    with fs.open_input_file(path) as f:
        parquet = pq.ParquetFile(f)
        if "remove" not in parquet.schema_arrow.names:
            return
        for remove in parquet.read(columns=["remove"]).column("remove").to_pylist():
            note(remove)
