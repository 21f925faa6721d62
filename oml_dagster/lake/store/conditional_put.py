"""Object stores without conditional put are refused (decision 0017): by the options that turn it
off, and by a probe of the store itself before the first table is opened, once per store and
credential set. Two writers committing one Delta log version both succeed on a store that ignores
`If-None-Match`; the writer's fence rests on the second one failing."""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple, Protocol
from urllib.parse import urlparse

from oml_dagster.lake.errors import UnsupportedObjectStore
from oml_dagster.lake.store.credentials import (
    ACCESS_KEY_OPTIONS,
    CONDITIONAL_PUT_OPTIONS,
    ENDPOINT_OPTIONS,
    REGION_OPTIONS,
    SECRET_KEY_OPTIONS,
    TOKEN_OPTIONS,
    option,
)

if TYPE_CHECKING:
    from botocore.client import BaseClient

# Options naming each way a store can be told to commit without put-if-absent.
UNSAFE_OPTIONS = {
    "aws_conditional_put": ("disabled", "false", "none"),
    "conditional_put": ("disabled", "false", "none"),
    "aws_s3_allow_unsafe_rename": ("true", "1", "yes"),
}
# Where the probe writes (and deletes) its scratch key: under the lake root for the shared
# credentials (no tenant prefix can look like it: tenant ids are UUIDs), under the tenant's prefix
# for a tenant's own (a credential scoped to `<root>/<tenant_id>/` reaches nothing else; no
# table's path starts with an underscore).
PROBE_PREFIX = "_oml_probe"
# The store's codes for credentials it refuses (a verdict on them, unlike a network fault).
REFUSED_CODES = (
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
)


class ProbedStore(Protocol):
    """What the probe reads of a lake (`layout.Lake`): where it is, how it is reached, and, for a
    lake bound to one tenant's own credentials, whose they are."""

    @property
    def root(self) -> str: ...

    @property
    def storage_options(self) -> Mapping[str, str]: ...

    @property
    def tenant_id(self) -> str | None: ...

    @property
    def own_source(self) -> str | None: ...

    @property
    def store(self) -> str: ...


class StoreKey(NamedTuple):
    """What a probe's verdict holds for: the endpoint, the bucket, the conditional-put mode and
    the signer (a tenant's own access key gets its own probe)."""

    endpoint: str
    bucket: str
    mode: str
    signer: str


def unsafe_settings(
    options: Mapping[str, str], *, object_store: bool
) -> list[tuple[str, str, str]]:
    """Each setting that turns put-if-absent off, as object_store sees it: (where, name, value)
    for a storage option, else (on an object-store lake) the `AWS_*` environment variable
    object_store reads itself when the options leave it unset.

    The other place the core reads the environment (ADR 0052), and not to take a setting:
    object_store reads these variables from the process environment whatever the options say,
    so the check must look where the library will."""
    found = [
        ("storage option", key, value)
        for key, value in options.items()
        if key.lower() in UNSAFE_OPTIONS
        and str(value).strip().lower() in UNSAFE_OPTIONS[key.lower()]
    ]
    if object_store:
        given = {key.lower() for key in options}
        for key, unsafe in UNSAFE_OPTIONS.items():
            value = os.environ.get(key.upper()) if key.startswith("aws_") else None
            if key not in given and value and value.strip().lower() in unsafe:
                found.append(("environment variable", key.upper(), value))
    return found


def refuse_unsafe_settings(options: Mapping[str, str], *, object_store: bool) -> None:
    """`UnsupportedObjectStore` naming the first setting that turns put-if-absent off."""
    for where, key, value in unsafe_settings(options, object_store=object_store):
        raise UnsupportedObjectStore(
            f"{where} {key}={value} commits without conditional put; an object store "
            "without put-if-absent is not a supported lake target (unset it)"
        )


def store_name(options: Mapping[str, str], root: str) -> str:
    """The object store as named in errors: endpoint and bucket."""
    endpoint = option(options, ENDPOINT_OPTIONS, "AWS_ENDPOINT_URL") or "aws"
    return f"{endpoint} bucket {urlparse(root).netloc}"


def store_key(lake: ProbedStore) -> StoreKey:
    options = lake.storage_options
    endpoint = option(options, ENDPOINT_OPTIONS, "AWS_ENDPOINT_URL") or "aws"
    mode = option(options, CONDITIONAL_PUT_OPTIONS, "AWS_CONDITIONAL_PUT") or "default"
    signer = option(options, ACCESS_KEY_OPTIONS, "AWS_ACCESS_KEY_ID") or "default chain"
    return StoreKey(endpoint.rstrip("/"), urlparse(lake.root).netloc, mode.lower(), signer)


# A verdict (None: conditional put honoured) is kept for the process, by `StoreKey`: a tenant's
# own credentials get their own probe, since one that cannot reach the store must fail before
# its first table is opened, not pass on the shared set's verdict.
_verdicts: dict[StoreKey, str | None] = {}
_verdicts_lock = threading.Lock()


def require_conditional_put(lake: ProbedStore) -> None:
    """Refuse an object store that ignores `If-None-Match`: probed once per `store_key`."""
    key = store_key(lake)
    with _verdicts_lock:
        if key not in _verdicts:
            _verdicts[key] = probe_conditional_put(lake)
        refusal = _verdicts[key]
    if refusal is not None:
        raise UnsupportedObjectStore(refusal)


def probe_conditional_put(lake: ProbedStore) -> str | None:
    """Put-if-absent twice on a scratch key under `<root>/_oml_probe/` (a tenant's own
    credentials: `<root>/<tenant_id>/_oml_probe/`): the second PUT with `If-None-Match: *` must
    fail with 412. When it succeeds the store ignored the header, and the returned refusal names
    the store. Errors reaching the store (credentials, missing bucket) propagate as `OSError`
    and are not a verdict. The requests are signed by botocore, from the same storage options
    and environment delta-rs commits with (delta-rs does not expose its object store)."""
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

    client = s3_client(lake)
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


def refusal_code(error: BaseException | None) -> str | None:
    """The store's code when `error` is its refusal of the credentials, else None."""
    # Only an S3 probe imports botocore: without it loaded, no error can be its ClientError.
    exceptions = sys.modules.get("botocore.exceptions")
    if exceptions is None or not isinstance(error, exceptions.ClientError):
        return None
    code = str(error.response.get("Error", {}).get("Code", ""))
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in REFUSED_CODES or status == 403:
        return code or f"HTTP {status}"
    return None


def s3_client(lake: ProbedStore) -> BaseClient:
    """A botocore S3 client configured like delta-rs: options first, then the environment and
    the default credential chain; path-style addressing for an explicit endpoint."""
    import botocore.session
    from botocore.config import Config

    options = lake.storage_options
    endpoint = option(options, ENDPOINT_OPTIONS, "AWS_ENDPOINT_URL")
    region = option(options, REGION_OPTIONS, "AWS_REGION")
    # A tenant's own credentials are the whole set: no shared key or token from the environment.
    own = lake.own_source is not None
    config = Config(
        region_name=region or option(options, (), "AWS_DEFAULT_REGION") or "us-east-1",
        s3={"addressing_style": "path"} if endpoint else {},
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=10,
        read_timeout=30,
    )
    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=option(options, ACCESS_KEY_OPTIONS, None if own else "AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=option(
            options, SECRET_KEY_OPTIONS, None if own else "AWS_SECRET_ACCESS_KEY"
        ),
        aws_session_token=option(options, TOKEN_OPTIONS, None if own else "AWS_SESSION_TOKEN"),
        config=config,
    )
