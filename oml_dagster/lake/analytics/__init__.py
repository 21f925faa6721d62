"""Lake analytics, read with DuckDB and its Delta extension: the per-tenant sandbox (`sandbox`)
and the SQL shell's guard (`guard`), the second reader's check (`second_reader`), the questions
(`reports`), commit lag (`lag`) and the workarea tree at a past instant (`areas`)."""
