# Prometheus from Debian's package (bookworm: 2.42), with the lake's alert rules and the compose
# stack's configuration, checked by promtool as the image is built. Built from the repository
# root (compose builds it as service `prometheus`):
#   docker build -f deploy/docker/prometheus.Dockerfile -t oml-lake-prometheus:0.1.0 .
ARG BASE_IMAGE=debian:bookworm-20251117-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/*
COPY deploy/prometheus/prometheus.yml deploy/prometheus/oml-lake.rules.yml /etc/oml-prometheus/
COPY deploy/docker/ci/prometheus.yml /etc/oml-prometheus/ci/prometheus.yml
# The CI copy of the rules: the stuck-tenant rule's ten minutes become 20 s and its `for:` 5 s,
# so the smoke run sees it fire and resolve within a few minutes.
RUN sed -e '/alert: OmlLakeTenantStuck/,/alert: OmlLakeOpsBehindGap/{s/> 600)/> 20)/;s/for: 2m/for: 5s/}' \
      /etc/oml-prometheus/oml-lake.rules.yml >/etc/oml-prometheus/ci/oml-lake.rules.yml \
 && promtool check rules /etc/oml-prometheus/oml-lake.rules.yml /etc/oml-prometheus/ci/oml-lake.rules.yml \
 && promtool check config --syntax-only /etc/oml-prometheus/prometheus.yml \
 && mkdir -p /var/lib/oml-prometheus && chown prometheus:prometheus /var/lib/oml-prometheus
USER prometheus
EXPOSE 9090
ENTRYPOINT ["prometheus", "--storage.tsdb.path=/var/lib/oml-prometheus", \
            "--storage.tsdb.retention.time=15d"]
CMD ["--config.file=/etc/oml-prometheus/prometheus.yml", "--web.listen-address=0.0.0.0:9090"]
