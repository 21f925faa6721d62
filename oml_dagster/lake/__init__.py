"""The lake-writer core: Postgres outbox → per-tenant Delta tables, exactly once. No Dagster here."""
