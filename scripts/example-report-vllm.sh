#!/usr/bin/env bash
# The vLLM example reports (docs/example-report-vllm/): the CPU build of vLLM in its local image
# (scripts/build-vllm-image.sh's install, host/vllmimage.py's build, by digest), the tiny Qwen3-MoE
# made here (scripts/make_vllm_moe.py), then two real nights on this machine's CPU:
#   examples/vllm-cpu.yaml      decode from the usage counters, one change per arm, blocked in time
#   examples/vllm-goodput.yaml  goodput at an SLO: every arm swept through concurrency levels
# Each night's morning report (Markdown, plots, the boot log of each failure class) and journal are
# copied into docs/example-report-vllm/ and docs/example-report-vllm-goodput/; nothing else runs on the machine meanwhile (one vLLM peaks ~4 GB and both
# cores). Starts and stops its own podman API service. Prints each night's wall time.
#   ONLY=vllm-cpu | ONLY=vllm-goodput   one of the two nights
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -x .venv/bin/python ] || bash scripts/install.sh
bash scripts/build-vllm-image.sh >/dev/null
python3 scripts/make_vllm_moe.py >/dev/null
source scripts/podman-service.sh start
trap 'podman_service_stop' EXIT
.venv/bin/python -m host.vllmimage >/dev/null

night() {   # night NAME OUT: run examples/NAME.yaml, copy its report and journal into OUT
  local name="$1" out="$2" start wall load_before load_after
  [ -d "journal/$name" ] && mv "journal/$name" "journal/$name.$(date +%Y%m%d-%H%M%S)"
  .venv/bin/tuner check "examples/$name.yaml" --show 3
  start=$SECONDS
  load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
  set +e
  .venv/bin/tuner run "examples/$name.yaml" --quiet
  local rc=$?
  set -e
  wall=$((SECONDS - start))
  load_after="$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "$name: tuner run exit $rc, wall time ${wall} s"
  TZ=UTC .venv/bin/tuner report "examples/$name.yaml" >/dev/null       # times in UTC, named
  rm -rf "$out" && mkdir -p "$out"
  cp "journal/$name/REPORT.md" "$out/"
  cp -r "journal/$name/report" "$out/"
  sed "s#$root/##g" "journal/$name/journal.jsonl" > "$out/journal.jsonl"   # paths relative to the repo
  for log in $(grep -o 'arms/[0-9]*/boot.log' "$out/REPORT.md" | sort -u); do
    mkdir -p "$out/$(dirname "$log")" && sed "s#$root/##g" "journal/$name/$log" > "$out/$log"
  done
  { echo; echo "---"; echo "Produced by \`bash scripts/example-report-vllm.sh\` (examples/$name.yaml) on a $(nproc)-core,"
    echo "$(awk '/MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo) GiB machine (no GPU) with vllm-cpu 0.32.0: campaign wall time"
    echo "${wall} s, \`tuner run\` exit ${rc}; load average (1, 5, 15 min) ${load_before} before the campaign, ${load_after} after it."; } >> "$out/REPORT.md"
}

if [ "${ONLY:-vllm-cpu}" = vllm-cpu ]; then night vllm-cpu docs/example-report-vllm; fi
if [ "${ONLY:-vllm-goodput}" = vllm-goodput ]; then night vllm-goodput docs/example-report-vllm-goodput; fi
