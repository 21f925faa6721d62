"""Which credentials reach a tenant's objects (decision 0048): the names a storage option goes by,
a tenant's own options layered over the shared set, and the lookup of one option with the
`AWS_*` fallback delta-rs and botocore apply themselves."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol

ENDPOINT_OPTIONS = ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint")
REGION_OPTIONS = ("aws_region", "region", "aws_default_region")
CONDITIONAL_PUT_OPTIONS = ("aws_conditional_put", "conditional_put")
ACCESS_KEY_OPTIONS = ("aws_access_key_id", "access_key_id")
SECRET_KEY_OPTIONS = ("aws_secret_access_key", "secret_access_key")
TOKEN_OPTIONS = ("aws_session_token", "aws_token", "session_token", "token")
# The options that say who the lake's requests are signed as: a tenant's own set replaces all of
# them (a shared session token must not ride along with a tenant's key). Endpoint, region, the
# retry defaults and the rest are the shared set's unless the tenant's set names them too.
CREDENTIAL_OPTIONS = frozenset(
    (
        *ACCESS_KEY_OPTIONS,
        *SECRET_KEY_OPTIONS,
        *TOKEN_OPTIONS,
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


def layered(shared: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
    """A tenant's storage options: the shared ones without their credentials, then the tenant's
    own over them (the endpoint, region and retry defaults stay the shared set's unless the
    tenant's set names them too)."""
    kept = {k: v for k, v in shared.items() if k.lower() not in CREDENTIAL_OPTIONS}
    ours = {k.lower() for k in own}
    kept = {k: v for k, v in kept.items() if k.lower() not in ours}
    return {**kept, **own}


def carries_keys(options: Mapping[str, str]) -> bool:
    """Whether `options` name both an access key id and its secret: a tenant's own set must."""
    names = {k.lower() for k in options}
    return bool(names & set(ACCESS_KEY_OPTIONS)) and bool(names & set(SECRET_KEY_OPTIONS))


def option(options: Mapping[str, str], names: tuple[str, ...], env: str | None) -> str | None:
    """A storage option by any of its names (case-insensitive), else the environment variable
    delta-rs itself would fall back to.

    One of the two places the core reads the environment (ADR 0052), and not to take a setting:
    it mirrors delta-rs's (and botocore's) own fallback to the `AWS_*` variables, so the probe
    and the errors name the store and signer the library will use."""
    for key, value in options.items():
        if key.lower() in names:
            return str(value)
    return (os.environ.get(env) or None) if env else None
