"""The one reader of `_delta_log`: entry names (multi-part and V2 checkpoints included), complete
checkpoints, `_last_checkpoint`, and tombstones from every kind of log entry."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from oml_dagster.lake.store import deltalog
from oml_dagster.lake.store.deltalog import CHECKPOINT, CHECKSUM, COMMIT, COMPACTED, LogFile
from oml_dagster.lake.store.layout import Lake
from oml_dagster_tests.helpers import split_checkpoint

V = f"{7:020d}"


@pytest.mark.parametrize(
    ("name", "entry"),
    [
        (f"{V}.json", LogFile(f"{V}.json", COMMIT, 7)),
        (f"{V}.crc", LogFile(f"{V}.crc", CHECKSUM, 7)),
        (f"{V}.checkpoint.parquet", LogFile(f"{V}.checkpoint.parquet", CHECKPOINT, 7)),
        (
            f"{V}.checkpoint.0000000002.0000000003.parquet",
            LogFile(f"{V}.checkpoint.0000000002.0000000003.parquet", CHECKPOINT, 7, 2, 3),
        ),
        (
            f"{V}.checkpoint.3a0d65cd-4056-49b8-937b-95f9e3ee90e5.parquet",
            LogFile(f"{V}.checkpoint.3a0d65cd-4056-49b8-937b-95f9e3ee90e5.parquet", CHECKPOINT, 7),
        ),
        (
            f"{V}.checkpoint.3a0d65cd-4056-49b8-937b-95f9e3ee90e5.json",
            LogFile(f"{V}.checkpoint.3a0d65cd-4056-49b8-937b-95f9e3ee90e5.json", CHECKPOINT, 7),
        ),
        (
            f"{3:020d}.{V}.compacted.json",
            LogFile(f"{3:020d}.{V}.compacted.json", COMPACTED, 7),
        ),
    ],
)
def test_every_kind_of_log_entry_is_recognised(name, entry):
    assert deltalog.parse_log_name(name) == entry


@pytest.mark.parametrize(
    "name",
    [
        "_last_checkpoint",
        f"_commit_{V}.json.tmp",
        f"{V}.json.tmp",
        "7.json",
        f"{V}.checkpoint.0000000004.0000000003.parquet",  # part beyond the count
        f"{V}.checkpoint.0000000000.0000000003.parquet",
        f"{V}.checkpoint.1.3.parquet",  # parts are numbered with 10 digits
        "_sidecars/3a0d65cd-4056-49b8-937b-95f9e3ee90e5.parquet",
    ],
)
def test_other_names_are_not_log_entries(name):
    assert deltalog.parse_log_name(name) is None


def test_a_multi_part_checkpoint_counts_only_with_every_part():
    single = f"{2:020d}.checkpoint.parquet"
    parts = [f"{5:020d}.checkpoint.{i:010d}.0000000003.parquet" for i in (1, 2, 3)]
    assert deltalog.complete_checkpoints([single, *parts]) == [2, 5]
    assert deltalog.complete_checkpoints([single, parts[0], parts[2]]) == [2]
    # Parts of two attempts at the same version with different part counts do not add up.
    other = f"{5:020d}.checkpoint.0000000002.0000000002.parquet"
    assert deltalog.complete_checkpoints([parts[0], other]) == []


def _table_with_tombstones(root: Path) -> tuple[str, dict[str, int]]:
    """A table overwritten three times (three tombstones) and checkpointed at its last version;
    returns its URI and each removed file's deletionTimestamp, read from the commits."""
    uri = str(root / "t")
    for i in range(4):
        write_deltalake(uri, pa.table({"a": [i] * 3}), mode="overwrite")
    DeltaTable(uri).create_checkpoint()
    stamps = {}
    for commit in sorted((Path(uri) / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            remove = json.loads(line).get("remove")
            if remove:
                stamps[remove["path"]] = remove["deletionTimestamp"]
    assert len(stamps) == 3
    return uri, stamps


def test_tombstones_of_a_multi_part_checkpoint_are_read_from_every_part(tmp_path):
    uri, stamps = _table_with_tombstones(tmp_path)
    version = split_checkpoint(uri, 3)
    log = Path(uri) / "_delta_log"
    # What log cleanup leaves: the checkpoint and the commits from it on.
    for commit in log.glob("*.json"):
        if int(commit.name[:20]) < version:
            commit.unlink()
    lake = Lake(str(tmp_path))
    fs = lake.filesystem(uri)
    listing = deltalog.list_files(fs)
    assert sum(1 for e in listing.entries() if e.kind == CHECKPOINT) == 3
    assert listing.checkpoints() == [version] == [deltalog.last_checkpoint(fs)]
    assert deltalog.checkpoint_hint(fs) == deltalog.CheckpointHint(version, 3)
    # The removes sit in different parts; every one is found, with its own timestamp.
    found = deltalog.tombstones(fs, listing.log)
    assert {p: int(t.timestamp() * 1000) for p, t in found.items()} == stamps
    # delta-rs reads the table through the same checkpoint.
    table = DeltaTable(uri)
    assert table.version() == version
    assert len(deltalog.live_files(table)) == 1


def test_an_incomplete_multi_part_checkpoint_is_not_the_last_one(tmp_path):
    uri, _ = _table_with_tombstones(tmp_path)
    version = split_checkpoint(uri, 3)
    log = Path(uri) / "_delta_log"
    (log / f"{version:020d}.checkpoint.0000000002.0000000003.parquet").unlink()
    fs = Lake(str(tmp_path)).filesystem(uri)
    assert deltalog.last_checkpoint(fs) is None
    # The hint still names it: the listing, not the hint, decides.
    assert deltalog.checkpoint_hint(fs).version == version


def test_the_last_checkpoint_is_the_listing_s_when_the_hint_lags(tmp_path):
    uri, _ = _table_with_tombstones(tmp_path)
    log = Path(uri) / "_delta_log"
    fs = Lake(str(tmp_path)).filesystem(uri)
    assert deltalog.last_checkpoint(fs) == 3
    # A writer killed between its checkpoint and `_last_checkpoint`.
    write_deltalake(uri, pa.table({"a": [9]}), mode="append")
    stale = (log / "_last_checkpoint").read_text()
    DeltaTable(uri).create_checkpoint()
    (log / "_last_checkpoint").write_text(stale)
    assert deltalog.checkpoint_hint(fs).version == 3
    assert deltalog.last_checkpoint(fs) == 4
    (log / "_last_checkpoint").unlink()
    assert deltalog.checkpoint_hint(fs) is None
    assert deltalog.last_checkpoint(fs) == 4


def test_a_table_root_without_a_log_has_no_checkpoint(tmp_path):
    (tmp_path / "empty").mkdir()
    fs = Lake(str(tmp_path)).filesystem(str(tmp_path / "empty"))
    assert deltalog.last_checkpoint(fs) is None
    assert deltalog.checkpoint_hint(fs) is None


def test_listing_separates_data_from_the_log_with_sizes_and_times(tmp_path):
    uri, _ = _table_with_tombstones(tmp_path)
    old = dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp()
    data = next(Path(uri).glob("*.parquet"))
    os.utime(data, (old, old))
    listing = deltalog.list_files(Lake(str(tmp_path)).filesystem(uri))
    assert set(listing.data) == {p.name for p in Path(uri).glob("*.parquet")}
    assert listing.data[data.name] == data.stat().st_size
    assert listing.data_mtime[data.name].timestamp() == old
    assert "_last_checkpoint" in listing.log
    assert listing.commits() == [0, 1, 2, 3]


def test_a_log_entry_is_read_by_its_name_as_the_listing_gives_it(tmp_path):
    uri, _ = _table_with_tombstones(tmp_path)
    fs = Lake(str(tmp_path)).filesystem(uri)
    listing = deltalog.list_files(fs)
    assert deltalog.commit_name(3) in listing.log
    assert deltalog.holds_commit(fs, 3) and not deltalog.holds_commit(fs, 4)
    on_disk = Path(uri) / "_delta_log" / deltalog.commit_name(3)
    assert deltalog.entry_bytes(fs, deltalog.commit_name(3)) == on_disk.read_bytes()
    assert len(deltalog.entry_bytes(fs, deltalog.commit_name(3))) == listing.log[on_disk.name][0]
