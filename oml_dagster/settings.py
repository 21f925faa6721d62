"""Every `OML_*` environment variable the lake-writer reads, declared once: its name, default,
type, the check a value must pass and what it sets.

The edges (the command line, the Dagster resources, a benchmark's main) read their settings here
and nowhere else, each when it needs it (a bad cron does not stop `oml-lake db upgrade`), and pass
the values down: the core (`oml_dagster.lake`) neither imports this module nor reads the
environment (ADR 0052; `oml_dagster.from_settings` builds the core's config objects). Unset and
empty are the same: the default. A value that fails its check is refused with `InvalidSetting`
(declared in `oml_dagster.setting_errors`, which imports nothing, so the core can classify it),
naming the variable, the value and what was expected; nothing falls back silently.

The `AWS_*` variables the lake's storage options take (`AWS_PASSTHROUGH`) follow delta-rs's and
botocore's own conventions; they are passed through as they are. The README's settings table is
generated from `SETTINGS` (`python -m oml_dagster.settings`) and a test keeps the two the same.
This module does not import Dagster.

Why one file: every `OML_*` variable is declared here and nowhere else, so one file is the
list the README's table is generated from.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
import uuid
import zoneinfo
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from oml_dagster.setting_errors import InvalidSetting

T = TypeVar("T")
Env = Mapping[str, str]


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable. `parse` turns a non-empty value into the setting's type or raises
    ValueError; `expected` says what a good value looks like, in the refusal. `aliases` are earlier
    names still read; a value under two names must be the same."""

    name: str
    default: T
    parse: Callable[[str], T]
    expected: str
    description: str
    aliases: tuple[str, ...] = ()
    # How the default reads in the README, when the value alone does not say it.
    shown_default: str | None = None

    def raw(self, env: Env | None = None) -> str | None:
        """The value set under this name or an alias (None: unset or empty)."""
        env = os.environ if env is None else env
        given = [(n, env[n]) for n in (self.name, *self.aliases) if (env.get(n) or "").strip()]
        if len({value.strip() for _, value in given}) > 1:
            shown = " and ".join(f"{n}={v!r}" for n, v in given)
            raise InvalidSetting(f"{shown} disagree; set {self.name} only")
        return given[0][1] if given else None

    def is_set(self, env: Env | None = None) -> bool:
        return self.raw(env) is not None

    def read(self, env: Env | None = None) -> T:
        """The setting's value from `env` (default: the process environment)."""
        raw = self.raw(env)
        return self.default if raw is None else self.accept(raw)

    def accept(self, raw: str, source: str | None = None) -> T:
        """`raw` as this setting's value, or InvalidSetting naming `source` (default: the
        variable) and the value."""
        try:
            return self.parse(raw.strip())
        except (ValueError, TypeError) as error:
            detail = f" ({error})" if str(error) else ""
            raise InvalidSetting(
                f"{source or self.name}={raw!r}: expected {self.expected}{detail}"
            ) from None


# --- parsers -------------------------------------------------------------------------------------


def _text(raw: str) -> str:
    return raw


def _integer(minimum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        if not re.fullmatch(r"[+-]?\d+", raw) or int(raw) < minimum:
            raise ValueError("")
        return int(raw)

    return parse


def _seconds(*, zero: bool) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError("") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise ValueError("")
        return value

    return parse


_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _switch(raw: str) -> bool:
    value = raw.lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError("")


_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,?#\-]+$")
_CRON_ALIASES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")


def _cron(raw: str) -> str:
    fields = raw.split()
    if raw in _CRON_ALIASES or (len(fields) == 5 and all(map(_CRON_FIELD.match, fields))):
        return " ".join(fields)
    raise ValueError("")


def _timezone(raw: str) -> str:
    try:
        zoneinfo.ZoneInfo(raw)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError("") from None
    return raw


def parse_storage_options(raw: str) -> dict[str, str]:
    """A JSON object of storage options, each value a string (booleans and numbers taken as
    their text); ValueError naming what is wrong, never quoting a value (they hold secrets)."""
    try:
        options = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON: {error}") from None
    if not isinstance(options, dict):
        raise ValueError("not an object")
    parsed = {}
    for key, value in options.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, int | float):
            value = str(value)
        if not isinstance(value, str):
            raise ValueError(f"option {key!r} is not a string")
        parsed[key] = value
    return parsed


# --- the settings ---------------------------------------------------------------------------------

PG_DSN: Setting[str] = Setting(
    "OML_PG_DSN",
    "postgresql://postgres@127.0.0.1:5432/postgres",
    _text,
    "a libpq connection string or URI",
    "The lake's Postgres (schema `oml`: outbox, policies, verdicts, dead letters).",
)
WRITER_PASSWORD: Setting[str | None] = Setting(
    "OML_WRITER_PASSWORD",
    None,
    _text,
    "a password",
    "The password `oml-lake db upgrade --writer-role ROLE` gives the writer's login role "
    "(ADR 0049); unset: the role's password is left as it is.",
    shown_default="none",
)
LAKE_URI: Setting[str] = Setting(
    "OML_LAKE_URI",
    "./.oml/oml-lake",
    _text,
    "a local path or an s3:// URI",
    "The lake root, the `oml-lake/` prefix included; local paths and S3 with conditional put.",
)
LAKE_STORAGE_OPTIONS: Setting[dict[str, str]] = Setting(
    "OML_LAKE_STORAGE_OPTIONS",
    {},
    parse_storage_options,
    "a JSON object of delta-rs storage options",
    "Storage options on top of the `AWS_*` variables (they win over them).",
    shown_default="none",
)

# A tenant's own storage options, by reference (ADR 0048): a variable of this prefix and the
# tenant's UUID in hex, or `<tenant_id>.json` in OML_TENANT_STORAGE_OPTIONS_DIR.
TENANT_STORAGE_VARIABLE = "OML_LAKE_STORAGE_OPTIONS__"
TENANT_STORAGE_OPTIONS_DIR: Setting[str | None] = Setting(
    "OML_TENANT_STORAGE_OPTIONS_DIR",
    None,
    _text,
    "a directory path",
    "Where tenants' own storage options are mounted: `<tenant_id>.json`, a JSON object holding "
    "at least the tenant's access key id and secret (or set "
    "`OML_LAKE_STORAGE_OPTIONS__<tenant UUID in hex>` to it); they replace the shared "
    "credentials for that tenant's prefix. A tenant without either uses the shared set.",
    shown_default="none",
)


def _count_setting(
    name: str,
    default: Any,
    minimum: int,
    description: str,
    *,
    what: str = "an integer",
    **more: Any,
) -> Setting[Any]:
    return Setting(name, default, _integer(minimum), f"{what} >= {minimum}", description, **more)


def _seconds_setting(name: str, default: float, description: str, *, zero: bool) -> Setting[float]:
    expected = f"seconds (a number {'>=' if zero else '>'} 0)"
    return Setting(name, default, _seconds(zero=zero), expected, description)


MAX_BATCH: Setting[int] = _count_setting(
    "OML_MAX_BATCH",
    50_000,
    2,
    "Ops per tenant batch at most (a batch also stops at about 64 MiB of payload); a drain "
    "takes fewer when OML_MEMORY_BUDGET_MIB calls for it.",
)
MEMORY_BUDGET_MIB: Setting[int] = _count_setting(
    "OML_MEMORY_BUDGET_MIB",
    960,
    0,
    "Resident memory (MiB) a drain aims to keep its process under: the batch cap starts at "
    "half of OML_MAX_BATCH, grows while batches peak well under it and shrinks after one that "
    "went over, never below a tenth of OML_MAX_BATCH (Linux; peaks can pass it by a batch's "
    "commit, bench/RESULTS.md); 0: no budget.",
)
TXN_LAG_LIMIT: Setting[int | None] = _count_setting(
    "OML_TXN_LAG_LIMIT",
    None,
    1,
    "Ops an idle table may lag before it gets a txn-only commit; below OML_MAX_BATCH.",
    shown_default="200, or half of OML_MAX_BATCH when that is less",
)
FOLD_TIMEOUT_SECONDS = _seconds_setting(
    "OML_FOLD_TIMEOUT_SECONDS",
    300.0,
    "A batch fold running longer fails with BatchTimeout naming its op.",
    zero=False,
)
RUN_DRAIN_SECONDS = _seconds_setting(
    "OML_RUN_DRAIN_SECONDS",
    60.0,
    "How long one lake-writer run keeps draining its tenant (0: one batch per run).",
    zero=True,
)
SHARD_RUN_SECONDS = _seconds_setting(
    "OML_SHARD_RUN_SECONDS",
    300.0,
    "How long one shard run keeps draining its shard's tenants (0: one pass per run).",
    zero=True,
)
SHARD_STANDING: Setting[bool] = Setting(
    "OML_SHARD_STANDING",
    True,
    _switch,
    "1/true/yes/on or 0/false/no/off (unset: on)",
    "The sensor keeps a run in flight for every shard, pending or not, and a shard run out of "
    "work polls the outbox until OML_SHARD_RUN_SECONDS (on); or runs only for shards with "
    "pending tenants, each ending at its first idle pass (off).",
    shown_default="on",
)
DRAIN_SHARDS: Setting[int] = _count_setting(
    "OML_DRAIN_SHARDS",
    4,
    0,
    "Shard runs the outbox sensor keeps, each draining a shard of tenants (0: a run per tenant).",
    what="a whole number",
)
FRESHNESS_BOUND_SECONDS = _seconds_setting(
    "OML_FRESHNESS_BOUND_SECONDS",
    300.0,
    "A tenant whose oldest undrained outbox row is older fails its fresh_within_bound check.",
    zero=False,
)
FRESHNESS_INTERVAL_SECONDS: Setting[int] = _count_setting(
    "OML_FRESHNESS_INTERVAL_SECONDS",
    60,
    1,
    "How often lake_freshness_sensor judges every tenant's lag.",
    what="whole seconds",
)
SENSOR_INTERVAL_SECONDS: Setting[int] = _count_setting(
    "OML_SENSOR_INTERVAL_SECONDS", 30, 1, "The outbox sensor's tick.", what="whole seconds"
)
DAGSTER_AUTOSTART: Setting[bool] = Setting(
    "OML_DAGSTER_AUTOSTART",
    True,
    _switch,
    "1/true/yes/on or 0/false/no/off (unset: on)",
    "The sensor and every schedule start RUNNING (on) or STOPPED (off).",
    shown_default="on",
)
SCHEDULE_TIMEZONE: Setting[str] = Setting(
    "OML_SCHEDULE_TIMEZONE",
    "UTC",
    _timezone,
    "an IANA timezone name",
    "The timezone of every schedule; OML_MAINTENANCE_TZ, its earlier name, is still read.",
    aliases=("OML_MAINTENANCE_TZ",),
)


def _cron_setting(name: str, default: str, description: str) -> Setting[str]:
    return Setting(name, default, _cron, "a five-field cron expression", description)


RECONCILE_CRON = _cron_setting(
    "OML_RECONCILE_CRON",
    "30 5 * * *",
    "When the reconciler's checks and the erasure evidence run, per tenant.",
)
ANALYTICS_CRON = _cron_setting(
    "OML_ANALYTICS_CRON", "0 6 * * *", "When the analytics assets are computed, per tenant."
)
COMPACT_CRON = _cron_setting("OML_COMPACT_CRON", "0 2 * * *", "Bin-pack OPTIMIZE of every table.")
ZORDER_CRON = _cron_setting(
    "OML_ZORDER_CRON", "0 3 * * 0", "Z-order OPTIMIZE of silver, curated and lineage."
)
VACUUM_CRON = _cron_setting(
    "OML_VACUUM_CRON", "0 4 * * *", "Checkpoint, VACUUM and log cleanup of every table."
)
RETRY_ATTEMPTS: Setting[int] = _count_setting(
    "OML_RETRY_ATTEMPTS",
    30,
    1,
    "Tries a drain makes through one streak of transient faults (a lost PostgreSQL session, an "
    "object store's 5xx, throttling, resets) before it stops (exit 4); a try that commits a "
    "batch ends the streak.",
)
RETRY_SECONDS = _seconds_setting(
    "OML_RETRY_SECONDS",
    300.0,
    "How long one streak of transient faults is ridden through, from its first fault (backoff "
    "0.25 s doubling to 15 s, with full jitter); 0: never retry.",
    zero=True,
)
PG_CONNECT_SECONDS = _seconds_setting(
    "OML_PG_CONNECT_SECONDS",
    5.0,
    "How long a process tries its first connection to PostgreSQL (a server never reached: "
    "`cannot reach PostgreSQL at HOST:PORT (reason)`, exit 4; each try also bounded by it) "
    "before it gives up; a connection lost after one succeeded is ridden through within "
    "OML_RETRY_SECONDS. A standing deployment whose runs may start while PostgreSQL restarts sets "
    "more (compose and Helm: 60).",
    zero=False,
)
DEBUG: Setting[bool] = Setting(
    "OML_DEBUG",
    False,
    _switch,
    "1/true/yes/on or 0/false/no/off (unset: off)",
    "`oml-lake` prints the traceback under its one-line error (as `--debug` does).",
    shown_default="off",
)
ERASURE_CADENCE_SECONDS: Setting[int] = _count_setting(
    "OML_ERASURE_CADENCE_SECONDS",
    86_400,
    0,
    "The maintenance cadence the erasure evidence allows on top of the erasure bound.",
    what="whole seconds",
)
PURGE_GRACE_SECONDS: Setting[float] = _seconds_setting(
    "OML_PURGE_GRACE_SECONDS",
    172_800.0,
    "How long after a tenant's departure the departure sensor starts its purge (time for an "
    "export on request); at most half the tenant's erasure bound, so the purge lands within it.",
    zero=True,
)
EXPORTER_LAKE_REFRESH_SECONDS = _seconds_setting(
    "OML_EXPORTER_LAKE_REFRESH_SECONDS",
    60.0,
    "How often `oml-lake exporter` reads the lake's logs (per-table numbers, the erasure "
    "verdict) in the background; PostgreSQL is read on every scrape.",
    zero=False,
)

SETTINGS: tuple[Setting[Any], ...] = (
    PG_DSN,
    WRITER_PASSWORD,
    LAKE_URI,
    LAKE_STORAGE_OPTIONS,
    TENANT_STORAGE_OPTIONS_DIR,
    MAX_BATCH,
    MEMORY_BUDGET_MIB,
    TXN_LAG_LIMIT,
    FOLD_TIMEOUT_SECONDS,
    RUN_DRAIN_SECONDS,
    DRAIN_SHARDS,
    SHARD_RUN_SECONDS,
    SHARD_STANDING,
    SENSOR_INTERVAL_SECONDS,
    FRESHNESS_BOUND_SECONDS,
    FRESHNESS_INTERVAL_SECONDS,
    DAGSTER_AUTOSTART,
    SCHEDULE_TIMEZONE,
    RECONCILE_CRON,
    ANALYTICS_CRON,
    COMPACT_CRON,
    ZORDER_CRON,
    VACUUM_CRON,
    ERASURE_CADENCE_SECONDS,
    PURGE_GRACE_SECONDS,
    EXPORTER_LAKE_REFRESH_SECONDS,
    RETRY_ATTEMPTS,
    RETRY_SECONDS,
    PG_CONNECT_SECONDS,
    DEBUG,
)

# The AWS variables taken as storage options of the lake (OML_LAKE_STORAGE_OPTIONS wins).
AWS_PASSTHROUGH = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ALLOW_HTTP",
)


# --- settings read together -----------------------------------------------------------------------


def lake_storage_options(env: Env | None = None) -> dict[str, str]:
    """The lake's storage options: the `AWS_*` variables that are set, then
    OML_LAKE_STORAGE_OPTIONS over them."""
    env = os.environ if env is None else env
    options = {k: env[k] for k in AWS_PASSTHROUGH if env.get(k)}
    options.update(LAKE_STORAGE_OPTIONS.read(env))
    return options


@dataclass(frozen=True)
class OwnStorageOptions:
    """A tenant's own storage options and where they were read (`source`, named in errors)."""

    options: dict[str, str]
    source: str


class TenantStorageReferences:
    """Where tenants' own storage options are found (ADR 0048): `<tenant_id>.json` in
    OML_TENANT_STORAGE_OPTIONS_DIR (a mounted secret) or a variable
    `OML_LAKE_STORAGE_OPTIONS__<tenant UUID in hex>`. Taken from the environment at the edge;
    a tenant's reference is read when its tables are first opened and kept for the process (a
    rotated secret counts from the next run). Nothing here falls back silently: a directory
    that is not there, a file that cannot be read or parsed, a stray name in the directory and
    a tenant named twice are refused, naming the tenant and the file or variable."""

    def __init__(self, directory: str | None = None, variables: Mapping[str, str] | None = None):
        self.directory = directory
        self.variables = {k.lower(): v for k, v in (variables or {}).items()}  # hex -> JSON
        self._files: dict[str, str] | None = None  # hex -> path, listed once
        self._resolved: dict[str, OwnStorageOptions | None] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, env: Env | None = None) -> TenantStorageReferences:
        env = os.environ if env is None else env
        variables = {}
        for name, raw in env.items():
            if not name.startswith(TENANT_STORAGE_VARIABLE) or not raw.strip():
                continue
            suffix = name[len(TENANT_STORAGE_VARIABLE) :]
            if not re.fullmatch(r"[0-9a-fA-F]{32}", suffix):
                raise InvalidSetting(
                    f"{name}: expected {TENANT_STORAGE_VARIABLE}<the tenant's UUID in hex, 32 "
                    "digits without dashes>"
                )
            variables[suffix] = raw
        return cls(TENANT_STORAGE_OPTIONS_DIR.read(env), variables)

    def __bool__(self) -> bool:
        return bool(self.directory or self.variables)

    def resolve(self, tenant_id: str) -> OwnStorageOptions | None:
        """The tenant's own storage options, or None: it has no reference (the shared set)."""
        key = uuid.UUID(tenant_id).hex
        with self._lock:
            if key not in self._resolved:
                self._resolved[key] = self._read(tenant_id, key)
            return self._resolved[key]

    def _read(self, tenant_id: str, key: str) -> OwnStorageOptions | None:
        path = self._listing(tenant_id).get(key)
        variable = f"{TENANT_STORAGE_VARIABLE}{key}" if key in self.variables else None
        if path and variable:
            raise InvalidSetting(
                f"tenant {tenant_id}: own storage options both in {path} and in {variable}; "
                "keep one"
            )
        if variable:
            source, raw = f"variable {variable}", self.variables[key]
        elif path:
            source = f"file {path}"
            try:
                with open(path, encoding="utf-8") as file:
                    raw = file.read()
            except (OSError, UnicodeDecodeError) as error:
                reason = getattr(error, "strerror", None) or str(error)
                raise InvalidSetting(
                    f"tenant {tenant_id}: cannot read its storage options {source} ({reason})"
                ) from None
        else:
            return None
        try:
            return OwnStorageOptions(parse_storage_options(raw), source)
        except ValueError as error:
            raise InvalidSetting(
                f"tenant {tenant_id}: {source} is not a JSON object of storage options ({error})"
            ) from None

    def _listing(self, tenant_id: str) -> dict[str, str]:
        """The directory's `<tenant_id>.json` files by tenant (listed once); names starting
        with a dot are passed over (a Kubernetes secret volume's `..data`)."""
        if self._files is None:
            files: dict[str, str] = {}
            if self.directory:
                where = f"{TENANT_STORAGE_OPTIONS_DIR.name}={self.directory!r}"
                try:
                    names = sorted(os.listdir(self.directory))
                except OSError as error:
                    raise InvalidSetting(
                        f"tenant {tenant_id}: {where} is not a readable directory "
                        f"({error.strerror}); mount the tenants' storage options there or "
                        "unset it"
                    ) from None
                for name in names:
                    if name.startswith("."):
                        continue
                    stem, _, ext = name.rpartition(".")
                    try:
                        tenant = uuid.UUID(stem).hex if ext == "json" else None
                    except ValueError:
                        tenant = None
                    if tenant is not None:
                        files[tenant] = os.path.join(self.directory, name)
                        continue
                    raise InvalidSetting(
                        f"{where}: {name!r} is not named <tenant_id>.json; rename or remove it "
                        "(a tenant's options would otherwise be passed over)"
                    )
            self._files = files
        return self._files


def writer_batch(env: Env | None = None) -> tuple[int, int | None]:
    """(OML_MAX_BATCH, OML_TXN_LAG_LIMIT); a lag limit not below the batch is refused here, naming
    both variables, rather than later by the writer's config."""
    max_batch = MAX_BATCH.read(env)
    lag_limit = TXN_LAG_LIMIT.read(env)
    if lag_limit is not None and lag_limit >= max_batch:
        raise InvalidSetting(
            f"{TXN_LAG_LIMIT.name}={lag_limit} with {MAX_BATCH.name}={max_batch}: the txn lag "
            "limit must stay below the batch"
        )
    return max_batch, lag_limit


def retry_bounds(env: Env | None = None) -> tuple[int, float]:
    """(OML_RETRY_ATTEMPTS, OML_RETRY_SECONDS): the bound of a streak of transient faults; a bound
    of 0 seconds is one try."""
    seconds = RETRY_SECONDS.read(env)
    return (RETRY_ATTEMPTS.read(env) if seconds > 0 else 1), seconds


# --- the README's table ---------------------------------------------------------------------------


def _shown(setting: Setting[Any]) -> str:
    if setting.shown_default is not None:
        return setting.shown_default
    value = setting.default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def markdown_table() -> str:
    """Every setting as a Markdown table, as the README shows it."""
    rows = ["| variable | default | value | what it sets |", "|---|---|---|---|"]
    for s in SETTINGS:
        names = " / ".join(f"`{n}`" for n in (s.name, *s.aliases))
        rows.append(f"| {names} | {_shown(s)} | {s.expected} | {s.description} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
