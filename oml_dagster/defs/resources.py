"""Resources for Postgres and the lake, configured from the environment in this one place
(OML_PG_DSN, OML_LAKE_URI, OML_LAKE_STORAGE_OPTIONS and the AWS_* variables)."""

from __future__ import annotations

import psycopg
from dagster import ConfigurableResource

from oml_dagster.lake import db
from oml_dagster.lake.storage import Lake


class PostgresResource(ConfigurableResource):
    """The authority: schema `oml` (outbox, policies, dead letters, frontier cache)."""

    dsn: str | None = None

    def connect(self) -> psycopg.Connection:
        return db.connect(self.dsn or db.dsn_from_env(), autocommit=True)


class LakeResource(ConfigurableResource):
    """The lake root and storage options; defaults come from the environment."""

    uri: str | None = None

    def get_lake(self) -> Lake:
        lake = Lake.from_env()
        return Lake(self.uri, lake.storage_options).checked() if self.uri else lake


def build_resources() -> dict:
    return {"postgres": PostgresResource(), "lake": LakeResource()}
