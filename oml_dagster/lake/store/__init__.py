"""The store: where the lake lives and how it is reached (`layout`, `credentials`,
`conditional_put`), reading its tables (`reads`, `sql`, `lookups`, `open_tables`), the Delta log
(`deltalog`), rewrites and maintenance."""
