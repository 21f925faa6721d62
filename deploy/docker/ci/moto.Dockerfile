# CI only: an S3 API server (moto's, the one the test suite uses) standing in for MinIO, which is
# not packaged anywhere this machine reaches. It answers a second If-None-Match PUT with 412, as
# the code location's conditional-put probe requires. Listens where MOTO_HOST/MOTO_PORT say.
ARG BASE_IMAGE=local/debian-ci:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir "moto[server]==5.2.6" "boto3==1.44.18"
ENV PATH=/opt/venv/bin:/usr/bin:/bin MOTO_HOST=127.0.0.1 MOTO_PORT=9000
USER nobody
CMD ["sh", "-c", "exec moto_server -H \"$MOTO_HOST\" -p \"$MOTO_PORT\""]
