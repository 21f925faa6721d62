"""Where the lake lives (DESIGN §5): the root URI, storage options, the per-tenant layout, and
reading tables. Object stores without conditional put are refused: by the options that turn it
off, and by a probe of the store itself before the first table is opened (decision 0017), once
per credential set. A tenant's tables are opened with the tenant's own credentials when it has
a reference to them, the shared set otherwise (`Lake.for_tenant`, decision 0048): every open
under a tenant's prefix goes through that one resolution.

Why one file (741 lines): everything that opens a tenant's tables goes through `Lake` (layout, the
tenant's credentials, the conditional-put probe) and `OpenTables`; the lookups at the end
(`FileKeys`, `rows_with`) read those same handles. They are the next to move out if it grows
(ADR 0053).
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import sys
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import TableNotFoundError
from deltalake.fs import DeltaStorageHandler

from oml_dagster.lake.errors import (
    CrossTenantAccess,
    InvalidSetting,
    TenantCredentialsRefused,
    UnsupportedObjectStore,
)
from oml_dagster.lake.model.tables import APP_ID, GOLD_CURATED, TableId, TableSpec
from oml_dagster.lake.store import deltalog

# Options naming each way a store can be told to commit without put-if-absent.
_UNSAFE_OPTIONS = {
    "aws_conditional_put": ("disabled", "false", "none"),
    "conditional_put": ("disabled", "false", "none"),
    "aws_s3_allow_unsafe_rename": ("true", "1", "yes"),
}
# Where the conditional-put probe writes (and deletes) its scratch key: under the lake root for
# the shared credentials (no tenant prefix can look like it: tenant ids are UUIDs), under the
# tenant's prefix for a tenant's own (a credential scoped to `<root>/<tenant_id>/` reaches
# nothing else; no table's path starts with an underscore).
PROBE_PREFIX = "_oml_probe"
_ENDPOINT_OPTIONS = ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint")
# object_store's own retry and timeouts for an S3 lake, unless the storage options set them (ADR
# 0045). A request gets 30 s (a 2-5 s stall passes), a connection 5 s; a failed idempotent request
# is retried up to 6 times within 30 s, backoff 100 ms doubling to 5 s. Past that the error
# reaches the writer, whose own retry (OML_RETRY_*) starts the drain over on fresh tables: a
# short store-level budget hands a stuck request to the level that can also reconnect
# PostgreSQL, instead of object_store's default of 3 minutes inside one request.
STORE_RETRY_DEFAULTS = {
    "timeout": "30s",
    "connect_timeout": "5s",
    "max_retries": "6",
    "retry_timeout": "30s",
    "backoff_config.init_backoff": "100ms",
    "backoff_config.max_backoff": "5s",
    "backoff_config.base": "2",
}
_CONDITIONAL_PUT_OPTIONS = ("aws_conditional_put", "conditional_put")
_ACCESS_KEY_OPTIONS = ("aws_access_key_id", "access_key_id")
_SECRET_KEY_OPTIONS = ("aws_secret_access_key", "secret_access_key")
_TOKEN_OPTIONS = ("aws_session_token", "aws_token", "session_token", "token")
# The options that say who the lake's requests are signed as: a tenant's own set replaces all of
# them (a shared session token must not ride along with a tenant's key). Endpoint, region, the
# retry defaults and the rest are the shared set's unless the tenant's set names them too.
CREDENTIAL_OPTIONS = frozenset(
    (
        *_ACCESS_KEY_OPTIONS,
        *_SECRET_KEY_OPTIONS,
        *_TOKEN_OPTIONS,
        "aws_profile",
        "profile",
        "aws_skip_signature",
        "skip_signature",
    )
)


class OwnOptions(Protocol):
    """A tenant's own storage options and where they were read (`source`, named in errors)."""

    @property
    def options(self) -> Mapping[str, str]: ...

    @property
    def source(self) -> str: ...


class TenantStorage(Protocol):
    """Where tenants' own storage options are found (ADR 0048). The edge builds it from the
    settings (`oml_dagster.settings.TenantStorageReferences`); false when it names none."""

    def __bool__(self) -> bool: ...

    def resolve(self, tenant_id: str) -> OwnOptions | None:
        """The tenant's own storage options, or None: it uses the shared set."""
        ...


@dataclass(frozen=True)
class Lake:
    """The lake root (the spec's `oml-lake/` prefix included) and how to reach it. Built at the
    edge from the settings (`oml_dagster.from_settings.lake`); the core takes it as given."""

    root: str
    storage_options: dict[str, str] = field(default_factory=dict)
    # Where tenants' own storage options are found (None: every tenant uses these options).
    tenant_storage: TenantStorage | None = field(default=None, repr=False, compare=False)
    # Set on the lake `for_tenant` returns: the one tenant it opens, and where that tenant's own
    # credentials were read (None: the shared set).
    tenant_id: str | None = None
    own_source: str | None = None
    _bound: dict[str, Lake] = field(default_factory=dict, init=False, repr=False, compare=False)

    def for_tenant(self, tenant_id: str) -> Lake:
        """This lake as tenant `tenant_id`'s tables are opened: with the tenant's own storage
        options over the shared ones (its credentials replacing the shared credentials) when it
        has a reference to them, with the shared set otherwise. Checked for conditional put with
        the tenant's credentials, under its prefix; kept per tenant. The lake returned opens that
        tenant's objects only (`CrossTenantAccess`)."""
        if self.tenant_id is not None:
            if tenant_id != self.tenant_id:
                raise CrossTenantAccess(
                    f"the lake opened for tenant {self.tenant_id} was asked for tenant "
                    f"{tenant_id}: each tenant's tables are opened through its own lake"
                )
            return self
        bound = self._bound.get(tenant_id)
        if bound is None:
            bound = self._bind(tenant_id)
            self._bound[tenant_id] = bound
        return bound

    def _bind(self, tenant_id: str) -> Lake:
        own = None
        if self.tenant_storage and not self.is_local:
            own = self.tenant_storage.resolve(tenant_id)
        if own is None:
            return dataclasses.replace(self, tenant_id=tenant_id)
        if not (
            any(k.lower() in _ACCESS_KEY_OPTIONS for k in own.options)
            and any(k.lower() in _SECRET_KEY_OPTIONS for k in own.options)
        ):
            raise InvalidSetting(
                f"tenant {tenant_id}: {own.source} names no aws_access_key_id and "
                "aws_secret_access_key; a tenant's own storage options carry its credentials"
            )
        bound = dataclasses.replace(
            self,
            storage_options=layered(self.storage_options, own.options),
            tenant_id=tenant_id,
            own_source=own.source,
        )
        try:
            return bound.checked()
        except OSError as error:
            refused = _refusal_code(error.__cause__)
            if refused is None:
                raise  # not a verdict on the credentials (a network fault is retried)
            raise TenantCredentialsRefused(
                f"tenant {tenant_id}: the object store {self.store} refused its own credentials "
                f"from {own.source} ({refused}) under {self.tenant_uri(tenant_id)}/; fix the "
                "reference or the credential's policy (it needs list, read, write and delete on "
                "the tenant's prefix)"
            ) from error

    def options_for(self, uri: str) -> dict[str, str]:
        """The storage options an object at `uri` is reached with: its tenant's (`for_tenant`)."""
        return self._for_uri(uri).storage_options

    def _for_uri(self, uri: str) -> Lake:
        tenant_id = self.tenant_of(uri)
        if self.tenant_id is not None:
            if tenant_id != self.tenant_id:
                raise CrossTenantAccess(
                    f"the lake opened for tenant {self.tenant_id} refuses {uri}: it is outside "
                    f"the tenant's prefix {self.tenant_uri(self.tenant_id)}/"
                )
            return self
        if tenant_id is None or not self.tenant_storage:
            return self
        return self.for_tenant(tenant_id)

    def tenant_of(self, uri: str) -> str | None:
        """The tenant whose prefix holds `uri` (None: not under a tenant's prefix)."""
        prefix = self._root_prefix()
        if not uri.startswith(prefix):
            return None
        first = uri[len(prefix) :].split("/", 1)[0]
        try:
            return first if str(uuid.UUID(first)) == first.lower() else None
        except ValueError:
            return None

    def with_store_defaults(self) -> Lake:
        """This lake with STORE_RETRY_DEFAULTS for each of those options it does not set (an
        object-store lake only)."""
        if self.is_local:
            return self
        given = {k.lower() for k in self.storage_options}
        defaults = {k: v for k, v in STORE_RETRY_DEFAULTS.items() if k not in given}
        if not defaults:
            return self
        return dataclasses.replace(self, storage_options={**defaults, **self.storage_options})

    def checked(self) -> Lake:
        """Refuse a store the writer cannot fence: only local paths and S3 with put-if-absent."""
        scheme = urlparse(self.root).scheme
        if scheme not in ("", "file", "s3", "s3a"):
            raise UnsupportedObjectStore(
                f"lake URI {self.root!r}: scheme {scheme!r} is not a supported lake target "
                "(local paths and s3:// with conditional put only)"
            )
        for where, key, value in self._unsafe_candidates():
            unsafe = _UNSAFE_OPTIONS[key.lower()]
            if str(value).strip().lower() in unsafe:
                raise UnsupportedObjectStore(
                    f"{where} {key}={value} commits without conditional put; an object store "
                    "without put-if-absent is not a supported lake target (unset it)"
                )
        self.require_conditional_put()
        return self

    def _unsafe_candidates(self) -> list[tuple[str, str, str]]:
        """Each setting that can turn put-if-absent off, as object_store sees it: a storage option,
        else (on an object-store lake) the `AWS_*` environment variable object_store reads
        itself when the options leave it unset.

        One of the two places the core reads the environment (ADR 0052), and not to take a
        setting: object_store reads these variables from the process environment whatever the
        options say, so the check must look where the library will."""
        found = [
            ("storage option", key, value)
            for key, value in self.storage_options.items()
            if key.lower() in _UNSAFE_OPTIONS
        ]
        if not self.is_local:
            given = {key.lower() for _, key, _ in found}
            for key in _UNSAFE_OPTIONS:
                variable = key.upper()
                if key.startswith("aws_") and key not in given and os.environ.get(variable):
                    found.append(("environment variable", variable, os.environ[variable]))
        return found

    def require_conditional_put(self) -> None:
        """Refuse an object store that ignores `If-None-Match` (it would let two writers both
        commit the same log version). Probed once per store and process; local lakes need none."""
        if not self.is_local:
            _require_conditional_put(self)

    @property
    def store(self) -> str:
        """The object store the lake lives in, as named in errors: endpoint and bucket."""
        endpoint = _option(self, _ENDPOINT_OPTIONS, "AWS_ENDPOINT_URL") or "aws"
        return f"{endpoint} bucket {urlparse(self.root).netloc}"

    @property
    def is_local(self) -> bool:
        return urlparse(self.root).scheme in ("", "file")

    def local_path(self, uri: str) -> str:
        return urlparse(uri).path if uri.startswith("file://") else uri

    def _root_prefix(self) -> str:
        root = self.root.rstrip("/")
        if self.is_local:
            root = os.path.abspath(self.local_path(root))
        return f"{root}/"

    def tenant_uri(self, tenant_id: str) -> str:
        return f"{self._root_prefix()}{tenant_id}"

    def table_uri(self, tenant_id: str, spec: TableSpec, workarea_id: str | None = None) -> str:
        uri = f"{self.tenant_uri(tenant_id)}/{spec.relpath}"
        if spec is GOLD_CURATED:
            if workarea_id is None:
                raise ValueError("a curated table needs its workarea_id")
            uri = f"{uri}/{workarea_id}"
        return uri

    def filesystem(self, uri: str) -> pafs.FileSystem:
        """The table root at `uri` as a pyarrow filesystem, through delta-rs's object store."""
        return pafs.PyFileSystem(DeltaStorageHandler(uri, self.options_for(uri) or None))

    def open(self, uri: str, version: int | None = None) -> DeltaTable | None:
        """The table at `uri` (latest, or `version`), or None when there is no table there. A
        `version` the log no longer holds raises: that is not the same as no table. The first
        open of an object-store table probes the store for conditional put (per credential
        set). A table under a tenant's prefix is opened with that tenant's options."""
        lake = self._for_uri(uri)
        lake.require_conditional_put()
        try:
            return DeltaTable(uri, version=version, storage_options=lake.storage_options or None)
        except TableNotFoundError:
            if version is not None:
                raise
            return None


class OpenTables:
    """Delta tables kept open across one drain's batches: a table already open is brought to its
    latest version with `update_incremental` (one read of the log's next entry) instead of being
    opened again (a listing of the log and a replay from the last checkpoint), and gold.areas'
    rows and each table's app transaction are read again only when its version changed.

    A table deleted under a drain (its prefix removed for a rebuild) would keep its old state
    through `update_incremental`, so each reuse checks that the log still holds the entry of
    the version the handle stands at; when it does not, the table is opened afresh. A table
    deleted and then rebuilt past that version meanwhile would pass the check: that takes
    another writer of the same tenant during the drain, which the lease rules out."""

    # What a drain keeps of its tables' match columns (`FileKeys`): some thousands of files'
    # keys, a small part of the memory budget.
    KEPT_KEY_BYTES = 32 * 2**20

    def __init__(self, lake: Lake):
        self.lake = lake
        self.keys = FileKeys(options_for=lake.options_for, most_bytes=self.KEPT_KEY_BYTES)
        self._tables: dict[str, DeltaTable] = {}
        self._rows: dict[str, tuple[int, pa.Table]] = {}
        self._txns: dict[str, tuple[int, int]] = {}

    def open(self, uri: str) -> DeltaTable | None:
        """The table at `uri` at its latest version, or None when there is none."""
        table = self._tables.get(uri)
        if table is not None:
            table.update_incremental()
            if self._holds(uri, table.version()):
                return table
            self.forget(uri)
        table = self.lake.open(uri)
        if table is not None:
            self._tables[uri] = table
        return table

    def _holds(self, uri: str, version: int) -> bool:
        try:
            return deltalog.holds_commit(self.lake.filesystem(uri), version)
        except TableNotFoundError:  # a local table's directory is gone
            return False

    def keep(self, uri: str, table: DeltaTable | None, txn: int | None = None) -> None:
        """Use `table` (reopened after a conflict, or just created) for `uri` from now on;
        `txn`, when given, is its app transaction at its version (the writer knows the one it
        committed)."""
        if table is None:
            self.forget(uri)
            return
        self._tables[uri] = table
        if txn is not None:
            self._txns[uri] = (table.version(), txn)

    def txn(self, uri: str, table: DeltaTable | None) -> int:
        """`app_txn(table)`, read from the log only when the table's version changed: each read
        replays the log since the last checkpoint (one GET per commit on S3)."""
        if table is None:
            return 0
        version = table.version()
        cached = self._txns.get(uri)
        if cached is None or cached[0] != version:
            cached = (version, app_txn(table))
            self._txns[uri] = cached
        return cached[1]

    def rows(self, uri: str, table: DeltaTable, spec: TableSpec) -> list[dict]:
        """`read_rows(table, spec)`, read again only when the table's version changed (fresh
        dicts each call: callers may change them)."""
        version = table.version()
        cached = self._rows.get(uri)
        if cached is None or cached[0] != version:
            cached = (version, read_table(table, spec))
            self._rows[uri] = cached
        return cached[1].to_pylist()

    def forget(self, prefix: str) -> None:
        """Drop every table at or under `prefix` (a tenant whose batch failed: reopen all)."""
        for cache in (self._tables, self._rows, self._txns):
            for uri in [u for u in cache if u == prefix or u.startswith(prefix + "/")]:
                del cache[uri]


def app_txn(table: DeltaTable | None) -> int:
    """The writer's app transaction version in `table`, read from its log (0: no table, or none
    recorded). Each call replays the log since the last checkpoint: a drain asks `OpenTables`."""
    return (table.transaction_version(APP_ID) or 0) if table is not None else 0


def layered(shared: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
    """A tenant's storage options: the shared ones without their credentials, then the tenant's
    own over them (the endpoint, region and retry defaults stay the shared set's unless the
    tenant's set names them too)."""
    kept = {k: v for k, v in shared.items() if k.lower() not in CREDENTIAL_OPTIONS}
    ours = {k.lower() for k in own}
    kept = {k: v for k, v in kept.items() if k.lower() not in ours}
    return {**kept, **own}


def _option(lake: Lake, names: tuple[str, ...], env: str | None) -> str | None:
    """A storage option by any of its names (case-insensitive), else the environment variable
    delta-rs itself would fall back to.

    The other place the core reads the environment (ADR 0052), and not to take a setting: it
    mirrors delta-rs's (and botocore's) own fallback to the `AWS_*` variables, so the probe and
    the errors name the store and signer the library will use."""
    for key, value in lake.storage_options.items():
        if key.lower() in names:
            return str(value)
    return (os.environ.get(env) or None) if env else None


# Store and credential set -> the refusal (None: conditional put honoured). A verdict is kept
# for the process. A tenant's own credentials get their own probe: one that cannot reach the
# store must fail before its first table is opened, not pass on the shared set's verdict.
_verdicts: dict[tuple[str, str, str, str], str | None] = {}
_verdicts_lock = threading.Lock()


def _store_key(lake: Lake) -> tuple[str, str, str, str]:
    endpoint = _option(lake, _ENDPOINT_OPTIONS, "AWS_ENDPOINT_URL") or "aws"
    mode = _option(lake, _CONDITIONAL_PUT_OPTIONS, "AWS_CONDITIONAL_PUT") or "default"
    signer = _option(lake, _ACCESS_KEY_OPTIONS, "AWS_ACCESS_KEY_ID") or "default chain"
    return (endpoint.rstrip("/"), urlparse(lake.root).netloc, mode.lower(), signer)


def _require_conditional_put(lake: Lake) -> None:
    key = _store_key(lake)
    with _verdicts_lock:
        if key not in _verdicts:
            _verdicts[key] = probe_conditional_put(lake)
        refusal = _verdicts[key]
    if refusal is not None:
        raise UnsupportedObjectStore(refusal)


def probe_conditional_put(lake: Lake) -> str | None:
    """Put-if-absent twice on a scratch key under `<root>/_oml_probe/` (a tenant's own
    credentials: `<root>/<tenant_id>/_oml_probe/`): the second PUT with `If-None-Match: *` must
    fail with 412. When it succeeds the store ignored the header, and the returned refusal names
    the store. Errors reaching the store (credentials, missing bucket) propagate and are not a
    verdict. The requests are signed by botocore, from the same storage options and environment
    delta-rs commits with (delta-rs does not expose its object store)."""
    parsed = urlparse(lake.root)
    base = parsed.path.strip("/")
    if lake.own_source is not None:
        base = f"{base}/{lake.tenant_id}"
    key = f"{base}/{PROBE_PREFIX}/{uuid.uuid4().hex}".lstrip("/")
    whose = (
        f", tenant {lake.tenant_id}'s credentials from {lake.own_source}"
        if lake.own_source is not None
        else ""
    )
    bucket = parsed.netloc
    from botocore.exceptions import BotoCoreError, ClientError  # only the S3 probe needs botocore

    client = _s3_client(lake)
    try:
        client.put_object(Bucket=bucket, Key=key, Body=b"first", IfNoneMatch="*")
        try:
            client.put_object(Bucket=bucket, Key=key, Body=b"second", IfNoneMatch="*")
        except ClientError as error:
            if error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") != 412:
                raise
            return None
        finally:
            client.delete_object(Bucket=bucket, Key=key)
    except (ClientError, BotoCoreError) as error:
        raise OSError(
            f"cannot probe object store {lake.store} (lake {lake.root}{whose}) for conditional "
            f"put: {error}"
        ) from error
    return (
        f"object store {lake.store} (lake {lake.root}{whose}) ignores If-None-Match: a second "
        f"put-if-absent of {key} succeeded, so two writers could both commit one log version; "
        "the lake needs an object store that honours conditional put (AWS S3, or a MinIO "
        "release that does: deploy/README.md)"
    )


_REFUSED_CODES = (
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
)


def _refusal_code(error: BaseException | None) -> str | None:
    """The store's code when `error` is its refusal of the credentials, else None."""
    # Only an S3 probe imports botocore: without it loaded, no error can be its ClientError.
    exceptions = sys.modules.get("botocore.exceptions")
    if exceptions is None or not isinstance(error, exceptions.ClientError):
        return None
    code = str(error.response.get("Error", {}).get("Code", ""))
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in _REFUSED_CODES or status == 403:
        return code or f"HTTP {status}"
    return None


def _s3_client(lake: Lake):
    """A botocore S3 client configured like delta-rs: options first, then the environment and
    the default credential chain; path-style addressing for an explicit endpoint."""
    import botocore.session
    from botocore.config import Config

    endpoint = _option(lake, _ENDPOINT_OPTIONS, "AWS_ENDPOINT_URL")
    region = _option(lake, ("aws_region", "region", "aws_default_region"), "AWS_REGION")
    # A tenant's own credentials are the whole set: no shared key or token from the environment.
    own = lake.own_source is not None
    config = Config(
        region_name=region or _option(lake, (), "AWS_DEFAULT_REGION") or "us-east-1",
        s3={"addressing_style": "path"} if endpoint else {},
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=10,
        read_timeout=30,
    )
    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=_option(lake, _ACCESS_KEY_OPTIONS, None if own else "AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=_option(
            lake, _SECRET_KEY_OPTIONS, None if own else "AWS_SECRET_ACCESS_KEY"
        ),
        aws_session_token=_option(lake, _TOKEN_OPTIONS, None if own else "AWS_SESSION_TOKEN"),
        config=config,
    )


def read_rows(table: DeltaTable, spec: TableSpec, where: str | None = None) -> list[dict]:
    """Rows of `table` as dicts, cast to the spec's types (MERGE writes view types). `where` is a
    SQL predicate; the query engine prunes files with the log's statistics."""
    return read_table(table, spec, where).to_pylist()


def read_table(table: DeltaTable, spec: TableSpec, where: str | None = None) -> pa.Table:
    """`read_rows` as one Arrow table."""
    return conform(query(table, "*", where), spec)


class FileKeys:
    """The writer's lookup of the rows a batch touches (`rows_with`), with each data file's match
    columns kept between lookups. A Delta data file never changes once written (a MERGE or a
    rewrite adds new files), so a drain that comes back to a table reads the match columns of
    the files added since its last visit only; a file whose columns hold a match is read whole.
    Listing the files takes the table's add actions, not a pyarrow dataset, whose construction
    costs about a millisecond per file (ADR 0036). The kept columns are bounded by
    `most_bytes`: past it the least recently used go."""

    # A lookup of few values in files whose match columns are not kept goes to the query
    # engine as an IN list instead: it prunes by statistics and reads in parallel (a 1M-row
    # table: 44 ms for 10 values, 236 ms for 1,000), where reading every key column costs
    # about 0.3 us a row plus ~2 ms a file (ADR 0043). Past some thousands of values the IN
    # list itself is the cost (ADR 0029).
    QUERY_MOST_VALUES = 1_000
    QUERY_FROM_ROWS = 20_000
    QUERY_ROWS_PER_VALUE = 500

    def __init__(
        self,
        storage_options: Mapping[str, str] | None = None,
        most_bytes: int = 0,
        options_for: Callable[[str], Mapping[str, str]] | None = None,
    ):
        # `options_for(table_uri)`: a table's own options (its tenant's, `Lake.options_for`).
        self.storage_options = dict(storage_options or {})
        self.options_for = options_for
        self.most_bytes = most_bytes
        self._kept: OrderedDict[tuple[str, str, tuple[str, ...]], pa.Table] = OrderedDict()
        self._bytes = 0
        self.read = 0  # files whose match columns were read (not kept from a lookup before)
        self.skipped = 0  # files passed over by their statistics (no match can be in them)
        self.queried = 0  # lookups answered by a query instead (few values, many rows unread)

    def rows_with(
        self, table: DeltaTable, spec: TableSpec, matches: Mapping[str, Collection[str]]
    ) -> list[dict]:
        """Rows of `table` whose value in one of the `matches` columns is among that column's
        strings, as dicts cast to the spec's types. Files whose statistics rule every value out
        are passed over. A lookup of many values reads the files' match columns, not an SQL
        `IN` list: the query engine plans one of tens of thousands of values in seconds, and
        past about 25,000 values overflows the calling thread's stack (a segfault in delta-rs;
        docs/decisions/0029). A lookup of few values that would read many rows' match columns
        afresh is such a query (`QUERY_MOST_VALUES`)."""
        if spec.partition_by:
            raise ValueError(f"{spec.name} is partitioned: rows_with reads unpartitioned tables")
        ordered = {c: sorted(v) for c, v in matches.items() if v}
        if not ordered:
            return []
        wanted = {c: pa.array(v, pa.string()) for c, v in ordered.items()}
        columns = tuple(sorted(wanted))
        files = pa.table(table.get_add_actions(flatten=True))
        sizes = dict(zip(files["path"].to_pylist(), files["size_bytes"].to_pylist(), strict=True))
        maybe = may_hold_any(files, ordered)
        values = sum(len(v) for v in ordered.values())
        if values <= self.QUERY_MOST_VALUES:
            counts = (
                files["num_records"].to_pylist()
                if "num_records" in files.column_names
                else [None] * files.num_rows
            )
            unread = sum(
                rows or 0  # a file without a row count counts for none
                for path, rows, hit in zip(sizes, counts, maybe, strict=True)
                if hit and (table.table_uri, path, columns) not in self._kept
            )
            if unread >= self.QUERY_FROM_ROWS + self.QUERY_ROWS_PER_VALUE * values:
                self.queried += 1
                where = " OR ".join(sql_in(c, v) for c, v in ordered.items())
                return read_rows(table, spec, where)
        options = self.options_for(table.table_uri) if self.options_for else self.storage_options
        filesystem = pafs.PyFileSystem(DeltaStorageHandler(table.table_uri, options or None, sizes))
        found = []
        for path, hit in zip(sizes, maybe, strict=True):
            if not hit:
                self.skipped += 1
                continue
            keys = self._columns(table.table_uri, filesystem, path, columns)
            mask = None
            for column, values in wanted.items():
                hit = pc.is_in(keys[column], value_set=values)
                mask = hit if mask is None else pc.or_(mask, hit)
            mask = pc.fill_null(mask, False)
            if pc.any(mask).as_py():
                # Cast before filtering: a MERGE writes view types, which Arrow cannot filter.
                whole = _PARQUET.make_fragment(path, filesystem=filesystem).to_table()
                found.append(conform(whole, spec).filter(mask))
        return pa.concat_tables(found).to_pylist() if found else []

    def _columns(
        self, table_uri: str, filesystem: pafs.FileSystem, path: str, columns: tuple[str, ...]
    ) -> pa.Table:
        """The file's `columns` as strings, from what is kept or read now (and kept)."""
        key = (table_uri, path, columns)
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
            return kept
        self.read += 1
        data = _PARQUET.make_fragment(path, filesystem=filesystem).to_table(columns=list(columns))
        kept = pa.table({c: pc.cast(data[c], pa.string()) for c in columns})
        if kept.nbytes <= self.most_bytes:
            self._kept[key] = kept
            self._bytes += kept.nbytes
            while self._bytes > self.most_bytes:
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= dropped.nbytes
        return kept


_PARQUET = pads.ParquetFileFormat()


def rows_with(
    table: DeltaTable, spec: TableSpec, matches: Mapping[str, Collection[str]]
) -> list[dict]:
    """`FileKeys.rows_with` with nothing kept: every file's match columns are read (a local
    table's; the writer's lookups go through `OpenTables.keys`, which knows the lake's store)."""
    return FileKeys().rows_with(table, spec, matches)


def may_hold_any(files: pa.Table, matches: Mapping[str, Collection[str]]) -> list[bool]:
    """For each data file in `files` (a table's flattened add actions), whether its log
    statistics leave room for one of the `matches`: a value of a column among that column's
    strings, within the file's min and max. A file without a column's statistics may hold
    anything. delta-rs truncates long string statistics to a prefix (the min) and to a prefix
    with its last character raised (the max), so the range still bounds every value."""
    maybe = [False] * files.num_rows
    for column, values in matches.items():
        if not values:
            continue
        if f"min.{column}" not in files.column_names or f"max.{column}" not in files.column_names:
            return [True] * files.num_rows
        ordered = sorted(values)  # linear when the caller passes them sorted
        lows = files[f"min.{column}"].to_pylist()
        highs = files[f"max.{column}"].to_pylist()
        for i, (low, high) in enumerate(zip(lows, highs, strict=True)):
            if maybe[i]:
                continue
            if low is None or high is None:
                maybe[i] = True
                continue
            first = bisect.bisect_left(ordered, low)
            maybe[i] = first < len(ordered) and ordered[first] <= high
    return maybe


def may_hold(table: DeltaTable, column: str, low: int, high: int) -> bool:
    """Whether some data file of `table` may hold a `column` value between `low` and `high`,
    by the min/max statistics its log records (a file without them may)."""
    files = pa.table(table.get_add_actions(flatten=True))
    if not files.num_rows:
        return False
    least, most = files[f"min.{column}"], files[f"max.{column}"]
    unknown = pc.or_(pc.is_null(least), pc.is_null(most))
    overlap = pc.and_(pc.less_equal(least, high), pc.greater_equal(most, low))
    return pc.any(pc.or_(unknown, pc.fill_null(overlap, False))).as_py()


def query(table: DeltaTable, columns: str = "*", where: str | None = None) -> pa.Table:
    sql = f"SELECT {columns} FROM t" + (f" WHERE {where}" if where else "")
    return pa.table(QueryBuilder().register("t", table).execute(sql).read_all())


def sql_text(value) -> str:
    """`value` as an SQL string literal (single quotes doubled)."""
    return "'" + str(value).replace("'", "''") + "'"


def sql_in(column: str, values) -> str:
    """`column IN (...)` over string values, or FALSE for none."""
    if not values:
        return "FALSE"
    return f"{column} IN ({', '.join(sql_text(v) for v in sorted(values))})"


def conform(data: pa.Table, spec: TableSpec) -> pa.Table:
    """`data` with exactly the spec's columns, in order, in the spec's Arrow types."""
    return data.select(spec.columns).cast(spec.schema)


def tenant_tables(lake: Lake, tenant_id: str) -> list[tuple[str, TableSpec, str]]:
    """Every existing table of a tenant as (name, spec, uri): the four core tables and one
    curated table per validated workarea (found through gold.areas)."""
    from oml_dagster.lake.model.tables import CORE_TABLES, GOLD_AREAS

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
                    found.append((str(TableId.curated(area["workarea_id"])), GOLD_CURATED, uri))
    return found
