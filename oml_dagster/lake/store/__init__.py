"""The store: the lake and its tables on disk or S3 (per-tenant credentials, the
conditional-put probe, lookups), the Delta log, rewrites, and maintenance."""
