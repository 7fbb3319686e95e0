#!/usr/bin/env bash
# Create .venv and install offload-tuner with its test extras (idempotent).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
mkdir -p .run
# constraints.txt pins every package to the versions the suite was last run with (CI uses it too)
if ! .venv/bin/python -m pip install -q -c constraints.txt -e ".[test,report]" >.run/pip-install.log 2>&1; then
  echo "[setup] pip install failed; its log:" >&2
  tail -30 .run/pip-install.log >&2
  exit 1
fi
.venv/bin/python -c "import podman, optuna, httpx, pandas, numpy, yaml, psutil, pydantic, markdown_it, matplotlib, pytest" \
  || { echo "[setup] python dependencies failed to install" >&2; exit 1; }
