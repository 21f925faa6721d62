"""delta-rs conformance suite (project issue 3).

Each test pins one behaviour of the pinned ``deltalake`` release that the lake-writer relies on.
The docstring of every test names the assumption and cites the delta-rs documentation page or
GitHub issue it rests on; every assertion message starts with the assumption's name so that a
failure after a version bump says which assumption broke. The capability table lives in
``docs/delta-rs-capabilities.md``.
"""
