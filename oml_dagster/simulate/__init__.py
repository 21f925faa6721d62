"""A producer that writes what the OML service writes under the Postgres contract (DESIGN §2)."""
