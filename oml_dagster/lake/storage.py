"""Where the lake lives (DESIGN §5): the root URI, storage options, the per-tenant layout, and
reading tables. Object stores without conditional put are refused."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from urllib.parse import urlparse

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import TableNotFoundError

from .errors import UnsupportedObjectStore
from .tables import GOLD_CURATED, TableSpec

DEFAULT_LAKE_URI = "./.oml/oml-lake"
# Options naming each way a store can be told to commit without put-if-absent.
_UNSAFE_OPTIONS = {
    "aws_conditional_put": ("disabled", "false", "none"),
    "conditional_put": ("disabled", "false", "none"),
    "aws_s3_allow_unsafe_rename": ("true", "1", "yes"),
}
_ENV_OPTIONS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ALLOW_HTTP",
)


@dataclass(frozen=True)
class Lake:
    """The lake root (the spec's `oml-lake/` prefix included) and how to reach it."""

    root: str
    storage_options: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls) -> Lake:
        root = os.environ.get("OML_LAKE_URI", DEFAULT_LAKE_URI)
        options = {k: os.environ[k] for k in _ENV_OPTIONS if os.environ.get(k)}
        extra = os.environ.get("OML_LAKE_STORAGE_OPTIONS")
        if extra:
            options.update(json.loads(extra))
        return cls(root, options).checked()

    def checked(self) -> Lake:
        """Refuse a store the writer cannot fence: only local paths and S3 with put-if-absent."""
        scheme = urlparse(self.root).scheme
        if scheme not in ("", "file", "s3", "s3a"):
            raise UnsupportedObjectStore(
                f"lake URI {self.root!r}: scheme {scheme!r} is not a supported lake target "
                "(local paths and s3:// with conditional put only)"
            )
        for key, value in self.storage_options.items():
            unsafe = _UNSAFE_OPTIONS.get(key.lower())
            if unsafe and str(value).lower() in unsafe:
                raise UnsupportedObjectStore(
                    f"storage option {key}={value} commits without conditional put; "
                    "an object store without put-if-absent is not a supported lake target"
                )
        return self

    @property
    def is_local(self) -> bool:
        return urlparse(self.root).scheme in ("", "file")

    def local_path(self, uri: str) -> str:
        return urlparse(uri).path if uri.startswith("file://") else uri

    def tenant_uri(self, tenant_id: str) -> str:
        root = self.root.rstrip("/")
        if self.is_local:
            root = os.path.abspath(self.local_path(root))
        return f"{root}/{tenant_id}"

    def table_uri(self, tenant_id: str, spec: TableSpec, workarea_id: str | None = None) -> str:
        uri = f"{self.tenant_uri(tenant_id)}/{spec.relpath}"
        if spec is GOLD_CURATED:
            if workarea_id is None:
                raise ValueError("a curated table needs its workarea_id")
            uri = f"{uri}/{workarea_id}"
        return uri

    def open(self, uri: str, version: int | None = None) -> DeltaTable | None:
        """The table at `uri` (latest, or `version`), or None when there is no table there. A
        `version` the log no longer holds raises: that is not the same as no table."""
        try:
            return DeltaTable(uri, version=version, storage_options=self.storage_options or None)
        except TableNotFoundError:
            if version is not None:
                raise
            return None


def read_rows(table: DeltaTable, spec: TableSpec, where: str | None = None) -> list[dict]:
    """Rows of `table` as dicts, cast to the spec's types (MERGE writes view types). `where` is a
    SQL predicate; the query engine prunes files with the log's statistics."""
    return conform(query(table, "*", where), spec).to_pylist()


def query(table: DeltaTable, columns: str = "*", where: str | None = None) -> pa.Table:
    sql = f"SELECT {columns} FROM t" + (f" WHERE {where}" if where else "")
    return pa.table(QueryBuilder().register("t", table).execute(sql).read_all())


def sql_in(column: str, values) -> str:
    """`column IN (...)` over string values, or FALSE for none."""
    if not values:
        return "FALSE"
    quoted = ", ".join("'" + str(v).replace("'", "''") + "'" for v in sorted(values))
    return f"{column} IN ({quoted})"


def conform(data: pa.Table, spec: TableSpec) -> pa.Table:
    """`data` with exactly the spec's columns, in order, in the spec's Arrow types."""
    return data.select(spec.columns).cast(spec.schema)


def tenant_tables(lake: Lake, tenant_id: str) -> list[tuple[str, TableSpec, str]]:
    """Every existing table of a tenant as (name, spec, uri): the four core tables and one
    curated table per validated workarea (found through gold.areas)."""
    from .tables import CORE_TABLES, GOLD_AREAS

    found = []
    for spec in CORE_TABLES:
        uri = lake.table_uri(tenant_id, spec)
        if lake.open(uri) is not None:
            found.append((spec.name, spec, uri))
    areas = lake.open(lake.table_uri(tenant_id, GOLD_AREAS))
    if areas is not None:
        for area in read_rows(areas, GOLD_AREAS):
            if area["status"] == "validated":
                uri = lake.table_uri(tenant_id, GOLD_CURATED, area["workarea_id"])
                if lake.open(uri) is not None:
                    found.append((f"{GOLD_CURATED.name}/{area['workarea_id']}", GOLD_CURATED, uri))
    return found
