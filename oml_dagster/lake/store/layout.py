"""Where the lake lives (DESIGN §5): the root URI, its storage options, the per-tenant layout, and
the opening of a table. A tenant's tables are opened with the tenant's own credentials when it
has a reference to them, the shared set otherwise (`Lake.for_tenant`, decision 0048): every open
under a tenant's prefix goes through that one resolution, and through the conditional-put check
of the credentials it resolves to (`conditional_put`, decision 0017).
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlparse

import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from deltalake.fs import DeltaStorageHandler

from oml_dagster.lake.errors import (
    CrossTenantAccess,
    InvalidSetting,
    TenantCredentialsRefused,
    UnsupportedObjectStore,
)
from oml_dagster.lake.model.tables import GOLD_CURATED, TableSpec
from oml_dagster.lake.store import conditional_put
from oml_dagster.lake.store.credentials import TenantStorage, carries_keys, layered

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
        if not carries_keys(own.options):
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
            refused = conditional_put.refusal_code(error.__cause__)
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
        conditional_put.refuse_unsafe_settings(self.storage_options, object_store=not self.is_local)
        self.require_conditional_put()
        return self

    def require_conditional_put(self) -> None:
        """Refuse an object store that ignores `If-None-Match` (it would let two writers both
        commit the same log version). Probed once per store and process; local lakes need none."""
        if not self.is_local:
            conditional_put.require_conditional_put(self)

    @property
    def store(self) -> str:
        """The object store the lake lives in, as named in errors: endpoint and bucket."""
        return conditional_put.store_name(self.storage_options, self.root)

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
