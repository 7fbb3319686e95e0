#!/usr/bin/env bash
# The example report (docs/example-report/): a simulated night of examples/sim-campaign.yaml,
# its report in UTC, its journal and the boot logs it links, and a screenshot of report.html's
# first screen in Debian's headless chromium (scripts/example_report.py says how). No podman.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -x .venv/bin/python ] || bash scripts/install.sh
command -v chromium >/dev/null 2>&1 || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
exec .venv/bin/python scripts/example_report.py "$@"
