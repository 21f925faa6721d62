#!/usr/bin/env bash
# The rolling upgrade and the restore drill in the compose stack (deploy/drills.py), with Docker
# and the base image set up as deploy/smoke.sh does. Hold the Docker lock around it:
#
#   flock /tmp/oml-docker.lock deploy/drills.sh upgrade
#   flock /tmp/oml-docker.lock deploy/drills.sh restore
set -euo pipefail
cd "$(dirname "$0")/.."
OML_SMOKE_THEN=deploy/drills.py exec bash deploy/smoke.sh "$@"
