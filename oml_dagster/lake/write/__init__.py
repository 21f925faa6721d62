"""The writer: a tenant batch folded and committed under its txn fence, the drain loop
around it, dead letters, the memory budget and the fold's watchdog."""
