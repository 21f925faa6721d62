# CI only: PostgreSQL 15 from Debian's packages, with the environment contract of the official
# postgres image that compose.yaml uses (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, data in
# /var/lib/postgresql/data), listening where PGHOST/PGPORT say (loopback under host networking).
ARG BASE_IMAGE=local/debian-ci:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o postgres -g postgres -m 700 /var/lib/postgresql/data
COPY deploy/docker/ci/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/bin:/usr/bin:/bin \
    PGDATA=/var/lib/postgresql/data PGHOST=127.0.0.1 PGPORT=5432
USER postgres
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
