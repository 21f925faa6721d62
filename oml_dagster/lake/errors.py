"""Typed errors of the lake-writer: each name says what was refused or went wrong."""

from __future__ import annotations

# Declared beside the settings (ADR 0052); the core raises it (a tenant's own storage options
# without credentials) and classifies it (faults), so it is named here too.
from oml_dagster.setting_errors import InvalidSetting as InvalidSetting


class LakeError(Exception):
    """Base of every error the lake-writer raises on purpose."""


class RefusedOp(LakeError):
    """An op the writer will not apply; it goes to `oml.lake_dead_letter` with `reason`."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class UnsupportedObjectStore(LakeError):
    """The lake URI names a store the writer cannot commit to safely (no conditional put)."""


class ConflictingCommit(LakeError):
    """A table kept meeting concurrent commits; the batch is left for the next run."""


class PostgresUnreachable(LakeError):
    """A process's first connection to PostgreSQL failed for its whole bound: the server was
    never reached (nothing connected, so nothing was lost), which a connection lost after one
    succeeded is not (that one is ridden through, ADR 0045 and ADR 0070)."""

    def __init__(self, address: str, reason: str, seconds: float):
        self.address, self.reason, self.seconds = address, reason, seconds
        super().__init__(f"cannot reach PostgreSQL at {address} ({reason})")


class InconsistentFrontier(LakeError):
    """A table records a txn version beyond the tenant's decided verdicts (lake and Postgres
    disagree, e.g. Postgres restored from an older backup than the lake)."""


class VerdictConflict(LakeError):
    """Another writer recorded different verdicts for the same ops; this run stops and the
    next run folds with the recorded ones."""


class LostCuratedTable(LakeError):
    """gold.areas marks a workarea validated but its curated table is gone. A curated table is
    built from silver as of the validation, which the live silver no longer shows, so it cannot
    be rebuilt alone: recover the tenant's whole prefix (delete it, then drain or backfill)."""


class BatchTimeout(LakeError):
    """A batch fold ran past its time bound; the message names the op it was on. Nothing of the
    batch was recorded or committed, so the next run starts it again."""


class UnknownTenant(LakeError):
    """A tenant named on the command line is not a UUID, or PostgreSQL does not know it (no
    policy, sequencer or outbox row): refused before anything is read or written."""


class RequeueError(LakeError):
    """A dead letter cannot be re-enqueued or resolved: there is none with that seq, it was
    already, or the resolution lacks its reason or name."""


class MaintenanceDamage(LakeError):
    """A maintenance step left a table that does not read back as it was: a live file missing
    after VACUUM, or a different version, file set or txn after log cleanup."""


class CrossTenantAccess(LakeError):
    """A lake opened for one tenant (`Lake.for_tenant`, with that tenant's credentials) was asked
    for an object outside the tenant's prefix: refused before any request is made."""


class TenantCredentialsRefused(LakeError):
    """The object store refused a tenant's own credentials on its prefix (the conditional-put
    probe, before the tenant's first table is opened); the message names the tenant and where
    its credentials were read."""


class TenantNotDeparted(LakeError):
    """A purge was asked for a tenant PostgreSQL does not say departed (`tenant_policy.departed_at`
    is NULL, or the tenant has no policy row): refused before anything is removed."""


class ExportTargetRefused(LakeError):
    """An export's target is not empty (and holds no unfinished export of the same tenant), or it
    lies under the lake root: refused before anything is written."""


class PurgeUnfinished(LakeError):
    """A purge could not leave the tenant's prefix empty or its outbox drained; the message names
    what is left. Running the purge again continues where it stopped."""


class TenantPurged(LakeError):
    """An export was asked of a tenant whose purge has started or finished: nothing of its lake
    is left to copy (its receipt says what was removed)."""
