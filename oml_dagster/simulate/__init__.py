"""A producer that writes what the OML service writes under the Postgres contract (DESIGN §2).

- `producer`: one act (or several consecutive acts of a tenant) committed with its signed,
  hash-chained journal event, outbox rows, claim bodies and crypto-shreds;
- `acts`: the op catalog's acts, one builder per op;
- `workload`: the deterministic per-tenant workload of `oml-lake simulate`, composed of
  `areas` (the workarea tree), `claims` (claim lifecycles), `simulations` (simulation runs and
  their taint) and `faults` (bad input), which share the `model` module's journal;
- `runner`: concurrent writers, chain-lock ordering, pacing;
- `verify`: the key-less checks of what was written;
- `cli`: the `simulate` subcommand.
"""
