"""Ingest: the stable-prefix cut (sequencer), the batch fetch over ADBC, and bronze's
columnar checks."""
