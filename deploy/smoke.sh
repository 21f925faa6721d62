#!/usr/bin/env bash
# The deployment, run for real: deploy/docker's compose stack in real containers, with the CI
# override (every image built locally from Debian's packages, moto's S3 API for MinIO, host
# networking on loopback), a workload streamed through it, the daemon and a run container killed
# mid-stream, a lost tenant prefix rebuilt by a backfill through the webserver's GraphQL API, and
# everything torn down, volumes too. Exits non-zero with the reason on any failure.
#
#   deploy/smoke.sh            (as root on a Debian machine; installs Docker when missing)
#
# OML_SMOKE_KEEP=1 leaves the stack up for a look (tear it down with the command it prints).
# The steps after the setup below are deploy/smoke.py's (Python's standard library only).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'smoke: %s\n' "$*" >&2; }
die() { say "FAILED: $*"; exit 1; }

# --- Docker: Debian's engine and docker-compose (v1), started by hand when no service runs it ---
if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker-compose >/dev/null 2>&1 \
   || ! command -v debootstrap >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
    || die "Docker, docker-compose and debootstrap are missing, and this is not root on Debian"
  say "installing docker.io, docker-compose and debootstrap from Debian's packages"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io docker-compose debootstrap \
    >/dev/null || die "apt-get could not install docker.io docker-compose debootstrap"
fi
if ! docker info >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || die "no Docker engine answers, and only root can start one here"
  # No bridge and no iptables: every container shares the host's network (loopback only).
  if [ ! -e /etc/docker/daemon.json ]; then
    mkdir -p /etc/docker
    echo '{"bridge": "none", "iptables": false, "ip6tables": false}' >/etc/docker/daemon.json
  fi
  say "starting dockerd (log: /var/log/oml-smoke-dockerd.log)"
  # Its own session and no inherited descriptor: a caller's `flock FILE deploy/smoke.sh` holds
  # the lock on an open descriptor, which a daemon started here would otherwise keep (and with
  # it the lock) for as long as the engine runs.
  python3 -c 'import subprocess, sys; subprocess.Popen(["dockerd"], stdin=subprocess.DEVNULL,
    stdout=open(sys.argv[1], "ab"), stderr=subprocess.STDOUT, close_fds=True,
    start_new_session=True)' /var/log/oml-smoke-dockerd.log
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || die "dockerd did not start: $(tail -3 /var/log/oml-smoke-dockerd.log)"
fi

# --- The base image, from Debian's packages: no registry is reachable -------------------------
if ! docker image inspect local/debian:bookworm >/dev/null 2>&1; then
  # The archive apt already uses: the repository names no mirror of its own.
  mirror="$(python3 deploy/apt_mirror.py)" || die "no Debian mirror to debootstrap from (above)"
  rootfs="$(mktemp -d /tmp/oml-smoke-rootfs.XXXXXX)"
  say "debootstrap bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/tmp/oml-smoke-debootstrap.log 2>&1 \
    || die "debootstrap failed: $(tail -3 /tmp/oml-smoke-debootstrap.log)"
  tar -C "$rootfs" -c . | docker import - local/debian:bookworm >/dev/null
  rm -rf "$rootfs"
fi

# deploy/soak.sh reuses this setup and runs the soak instead (OML_SMOKE_THEN).
exec python3 "${OML_SMOKE_THEN:-deploy/smoke.py}" "$@"
