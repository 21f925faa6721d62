#!/usr/bin/env bash
# The chaos soak (deploy/soak.py): the compose stack streaming under a seeded schedule of faults
# in its containers, then checked exact. Docker and the base image as deploy/smoke.sh sets them up
# (its setup runs first, then the soak instead of the smoke steps). Hold the Docker lock around
# it on a shared machine:
#
#   flock /tmp/oml-docker.lock deploy/soak.sh                  # 10 minutes of faults
#   flock /tmp/oml-docker.lock deploy/soak.sh --seconds 120 --gaps 20 40   # the short form (CI)
set -euo pipefail
cd "$(dirname "$0")/.."
OML_SMOKE_THEN=deploy/soak.py exec bash deploy/smoke.sh "$@"
