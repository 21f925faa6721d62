"""OML lake-writer: the single writer of the per-tenant Delta Lake, as a Dagster code location.

`oml_dagster.lake` is the core (plain Python, no Dagster); `oml_dagster.defs` is the thin
Dagster layer over it; `oml_dagster.cli` is the `oml-lake` command.
"""

import os

# delta-rs allocates with its own jemalloc, which by default keeps the pages it freed resident
# for ten seconds. A drain's batches come faster than that, so each batch began on top of what
# the last one's commits had freed, and the memory governor counted it as the process's baseline
# (ADR 0041). A background thread now hands freed pages back after one second, at no measured
# cost to a MERGE. jemalloc reads this once, when delta-rs's library first allocates: it is set
# here, before anything of ours imports deltalake. An operator's own setting wins.
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"
os.environ.setdefault("_RJEM_MALLOC_CONF", JEMALLOC_CONF)
