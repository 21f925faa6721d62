"""The model: the spec's tables (declarations read from columns.tsv) and the op catalog
with its one fold."""
