#!/usr/bin/env bash
# Create .venv and install offload-tuner with its test extras (idempotent).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e ".[test,report]" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import podman, optuna, httpx, pandas, yaml, psutil, pytest" \
  || { echo "[setup] python dependencies failed to install" >&2; exit 1; }
