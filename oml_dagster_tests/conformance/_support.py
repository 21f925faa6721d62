"""Small helpers shared by the conformance tests (no mocks: they only read real files)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

LIST_OF_STRUCT = pa.list_(pa.struct([("k", pa.string()), ("n", pa.int64())]))


def broken(assumption: str, detail: str) -> str:
    """Assertion message naming the assumption that no longer holds."""
    return f"delta-rs assumption broken [{assumption}]: {detail}"


@contextmanager
def must_raise(
    exc_type: type[BaseException], assumption: str, match: str | None = None
) -> Iterator[Any]:
    """``pytest.raises`` whose failure message names the assumption that broke."""
    try:
        with pytest.raises(exc_type, match=match) as info:
            yield info
    except (pytest.fail.Exception, AssertionError) as e:
        pytest.fail(broken(assumption, str(e)))


def log_dir(table_uri: str) -> Path:
    return Path(table_uri) / "_delta_log"


def log_listing(table_uri: str) -> list[str]:
    return sorted(os.listdir(log_dir(table_uri)))


def commit_actions(table_uri: str, version: int) -> list[dict[str, Any]]:
    """The actions of one JSON commit file, in file order."""
    text = (log_dir(table_uri) / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def actions_of(table_uri: str, version: int, kind: str) -> list[dict[str, Any]]:
    return [a[kind] for a in commit_actions(table_uri, version) if kind in a]


def added_paths(table_uri: str, version: int) -> list[str]:
    """Absolute paths of the data files added by commit ``version``."""
    return [str(Path(table_uri) / a["path"]) for a in actions_of(table_uri, version, "add")]


def add_actions(dt: DeltaTable) -> pa.Table:
    return pa.table(dt.get_add_actions(flatten=True))


def active_files(dt: DeltaTable) -> set[str]:
    return set(add_actions(dt).column("path").to_pylist())


def footer_stats(path: str) -> dict[str, tuple[bool, int | None] | None]:
    """Per column of the first row group: None when the footer carries no statistics at all,
    else (has_min_max, null_count or None)."""
    md = pq.ParquetFile(path).metadata
    out: dict[str, tuple[bool, int | None] | None] = {}
    for rg in range(md.num_row_groups):
        for c in range(md.num_columns):
            col = md.row_group(rg).column(c)
            st = col.statistics
            out[col.path_in_schema] = (
                None
                if st is None
                else (st.has_min_max, st.null_count if st.has_null_count else None)
            )
    return out


def footer_compression(path: str) -> str:
    return pq.ParquetFile(path).metadata.row_group(0).column(0).compression


def id_chunk(k: int, rows: int = 100) -> pa.Table:
    """Rows with ids k*rows .. k*rows+rows-1, one chunk per data file when appended separately."""
    ids = list(range(k * rows, k * rows + rows))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "c": pa.array([f"v{i}" for i in ids], pa.string()),
        }
    )


def envelope_rows(ids: list[int]) -> pa.Table:
    """Rows shaped like the lake's envelope tables: binary ciphertext and list<struct>."""
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "s": pa.array([f"s{i}" for i in ids], pa.string()),
            "body_ciphertext": pa.array([b"\x00ct-%d\xff" % i for i in ids], pa.binary()),
            "tags": pa.array([[{"k": "t", "n": i}] for i in ids], LIST_OF_STRUCT),
        }
    )
