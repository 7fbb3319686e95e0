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
.venv/bin/tuner demo "$@"
