#!/usr/bin/env bash
# The whole test suite, on a real podman API service started for this run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/install.sh
# llama-server (a real engine for the measurement tests), built once and cached outside the repo
# cmake builds llama-server; systemd-analyze (Debian's systemd package; systemd need not run) verifies promoted units
# chromium (Debian's) opens report.html and the dashboard in tests/test_browser.py, driven by playwright
# with executable_path: playwright's own browser download is never used
missing=""
command -v cmake >/dev/null 2>&1 || missing="$missing cmake"
command -v systemd-analyze >/dev/null 2>&1 || missing="$missing systemd"
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
command -v tmux >/dev/null 2>&1 || missing="$missing tmux"      # tests/test_liveview.py: the live view in a real terminal
# PostgreSQL (Debian's): tests/test_shared*.py start a private server of their own (host/pgserver.py)
ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || missing="$missing postgresql"
if [ -n "$missing" ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
bash scripts/build-llama-server.sh >/dev/null
bash scripts/build-vllm-image.sh >/dev/null && python3 scripts/make_vllm_moe.py >/dev/null   # vLLM (CPU) env, rootfs and tiny model, cached outside the repo
source scripts/podman-service.sh start
trap 'podman_service_stop' EXIT
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
# pytest exit 5 means no tests ran: that is a failure here
[ "$rc" -eq 5 ] && { echo "[test] no tests were collected" >&2; exit 1; }
exit "$rc"
