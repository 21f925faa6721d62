# CI only: the base every CI image builds from. local/debian:bookworm is a debootstrap of
# Debian's packages (deploy/smoke.sh makes it; no registry is reachable), and this layer adds the
# build machine's extra CA certificates, copied into the build context by smoke.sh, so that apt
# and pip inside the image builds reach the package mirrors through that machine's TLS proxy.
# Production images build from a registry's debian image and never carry these certificates.
FROM local/debian:bookworm
COPY *.crt /usr/local/share/ca-certificates/
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt
