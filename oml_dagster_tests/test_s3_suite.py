"""The core suite's guarantees on S3: the same test bodies as on disk, run again with the `lake`
fixture pointing at a fresh bucket on the loopback S3 server (moto), configured through the
environment as a deployment is. Exactly-once and replays, racing writers, retracts (demote,
erase, simulation end, repair), maintenance, erasure evidence, the Dagster assets and their
checks.

Chosen to cover each guarantee once while keeping the S3 time of CI to about a minute and a half:
the three-round race, the kill-at-every-commit loop (the random-kill loop runs here), and repeats of maintenance steps already run here stay
local-only; test_s3_lake.py races two writers on S3 and test_maintenance.py runs compaction,
VACUUM and log cleanup on S3. Not repeatable here as written: tests that inspect files with
local-path calls (os.walk, Path, shutil) and the checkpoint-timing test (its "fresh commits"
outlive a one-second bound at S3 speed). test_s3_evidence.py proves through the object store
what the erasure test proves with os.walk."""

from __future__ import annotations

import pytest

from oml_dagster.lake.store.layout import Lake
from oml_dagster_tests.test_assets import (  # noqa: F401
    test_a_run_lands_the_same_tables_as_the_core_drain,
    test_the_reconciler_checks_run_per_partition,
)
from oml_dagster_tests.test_commit_fence import (  # noqa: F401
    test_a_table_ahead_of_the_recorded_verdicts_stops_the_writer,
    test_a_table_with_nothing_to_change_gets_a_txn_only_commit_when_it_lags,
    test_a_writer_that_loses_the_race_reloads_and_skips,
    test_every_commit_records_the_txn_and_the_batch_bounds,
    test_replaying_a_committed_batch_changes_nothing,
)
from oml_dagster_tests.test_crash_replay import (  # noqa: F401
    test_killed_at_random_times_then_finishing,
)
from oml_dagster_tests.test_erasure import (  # noqa: F401
    test_erasure_evidence_command_exits_nonzero_on_a_dead_lettered_erase,
    test_erasure_evidence_fails_until_vacuum_then_holds,
    test_erasure_evidence_reports_dead_lettered_and_waiting_erases,
)
from oml_dagster_tests.test_maintenance import (  # noqa: F401
    test_maintenance_jobs_run_under_the_tenant_lease_and_report_metadata,
    test_optimize_between_a_batchs_commits_neither_duplicates_nor_loses,
)
from oml_dagster_tests.test_ops import (  # noqa: F401
    test_demote_then_demote_again_changes_nothing,
    test_erase_in_the_batch_of_its_promotion,
    test_erase_nulls_body_and_attachments_and_is_terminal,
    test_repair_replaces_the_row_and_fences_older_ops,
    test_simulation_end_demotes_its_rows_and_edges_and_the_taint_closure_on_request,
)

pytestmark = pytest.mark.s3


@pytest.fixture
def lake(s3_env_lake) -> Lake:
    """Every test above, on a fresh bucket of the loopback S3 server."""
    assert s3_env_lake.root.startswith("s3://")
    return s3_env_lake
