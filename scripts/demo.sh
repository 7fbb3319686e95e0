#!/usr/bin/env bash
# A real run on the built-in simulated engine: build its image, boot it in podman by digest,
# measure it. Installs what it needs; starts and stops its own podman API service.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/install.sh
source scripts/podman-service.sh start
trap 'podman_service_stop' EXIT
.venv/bin/tuner image
# a fresh night each time: an earlier demo's folder is kept beside it
[ -d journal/sim-demo ] && mv journal/sim-demo "journal/sim-demo.$(date +%Y%m%d-%H%M%S)"
.venv/bin/tuner check examples/sim-campaign.yaml --show 5
.venv/bin/tuner run examples/sim-campaign.yaml --quiet "$@"
.venv/bin/tuner status examples/sim-campaign.yaml
