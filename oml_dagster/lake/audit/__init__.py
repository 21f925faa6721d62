"""The audit: the reconciler, the erasure evidence, the doctor's one verdict, and
freshness."""
