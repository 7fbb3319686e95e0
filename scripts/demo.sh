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
# the morning: promote the winner into the demo's own unit (journal/sim-demo-units/), then take it back.
# Without a running systemd the unit file is written only (--write-only); with one, promote restarts it.
if systemctl show --property=Version >/dev/null 2>&1; then wo=""; else wo="--write-only"; fi
echo "== tuner promote examples/sim-campaign.yaml $wo"
.venv/bin/tuner promote examples/sim-campaign.yaml $wo
echo "== tuner rollback examples/sim-campaign.yaml $wo"
.venv/bin/tuner rollback examples/sim-campaign.yaml $wo
