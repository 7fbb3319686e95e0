#!/usr/bin/env bash
# The llama.cpp example report (docs/example-report-llamacpp/): build llama-server and its image,
# write the random-weight MoE model, run examples/llamacpp-cpu.yaml on this machine's CPU, render
# the morning report and copy it (Markdown, plots, the boot log of each failure class) into docs/.
# Starts and stops its own podman API service. Prints the wall time of the campaign.
#
# A real box is not an idle one (issue 19): before the night the page cache is dropped (as root:
# the model's files, the image and llama-server are read from disk again), and a process this
# script starts keeps one core busy from a third of the night to two thirds of it. The report
# shows what that did: the runs marked contended and left out, warm-up, the drift the blocks saw.
#   IDLE=1   neither (the idle night of earlier examples)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -x .venv/bin/python ] || bash scripts/install.sh
bin="$(bash scripts/build-llama-server.sh | tail -1)"
source scripts/podman-service.sh start
trap 'podman_service_stop' EXIT
.venv/bin/python -m host.llamaimage "$bin"
.venv/bin/python scripts/make_moe_gguf.py
[ -d journal/llamacpp-cpu ] && mv journal/llamacpp-cpu "journal/llamacpp-cpu.$(date +%Y%m%d-%H%M%S)"
.venv/bin/tuner check examples/llamacpp-cpu.yaml --show 5
secs="$(.venv/bin/python -c "import yaml; print(int(float(yaml.safe_load(open('examples/llamacpp-cpu.yaml'))['budget']['hours']) * 3600))")"
conditions="an idle machine"
bgload=""
if [ "${IDLE:-0}" != 1 ]; then
  sync
  if echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then dropped="the page cache dropped before the first boot"
  else dropped="the page cache NOT dropped (not root)"; fi
  bgload="$(mktemp)"
  ( sleep $((secs / 3))
    echo "on $(date -u +%H:%M:%S)" >> "$bgload"
    timeout $((secs / 3)) .venv/bin/python -c 'while True: pass' offload-tuner-background-load || true
    echo "off $(date -u +%H:%M:%S)" >> "$bgload" ) &
  bgpid=$!          # the timer and its load die with the night, however it ends (never a later night's load)
  trap 'kill "$bgpid" 2>/dev/null || true; pkill -f offload-tuner-background-load || true; podman_service_stop' EXIT
  conditions="${dropped}, and one core kept busy by a background process from a third of the night to two thirds"
fi
start=$SECONDS
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/tuner run examples/llamacpp-cpu.yaml --quiet "$@"
wall=$((SECONDS - start))
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"
[ -n "${bgpid:-}" ] && { kill "$bgpid" 2>/dev/null || true; }
pkill -f offload-tuner-background-load || true
if [ -n "$bgload" ] && [ -s "$bgload" ]; then
  conditions="${conditions} (on at $(awk '/^on/ {print $2}' "$bgload") UTC, off at $(awk '/^off/ {print $2}' "$bgload") UTC)"
fi
TZ=UTC .venv/bin/tuner report examples/llamacpp-cpu.yaml >/dev/null     # times in UTC, named
out=docs/example-report-llamacpp
rm -rf "$out" && mkdir -p "$out"
cp journal/llamacpp-cpu/REPORT.md "$out/"
cp -r journal/llamacpp-cpu/report "$out/"
sed "s#$root/##g" journal/llamacpp-cpu/journal.jsonl > "$out/journal.jsonl"   # what the report was rendered from (paths relative to the repo)
[ -f journal/llamacpp-cpu/membw.json ] && cp journal/llamacpp-cpu/membw.json "$out/"
for log in $(grep -o 'arms/[0-9]*/boot.log' "$out/REPORT.md" | sort -u); do
  mkdir -p "$out/$(dirname "$log")" && cp "journal/llamacpp-cpu/$log" "$out/$log"
done
{ echo; echo "---"; echo "Produced by \`bash scripts/example-report-llamacpp.sh\` on a $(nproc)-core,"
  echo "$(awk '/MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo) GiB machine (no GPU): campaign wall time ${wall} s; load average"
  echo "(1, 5, 15 min) ${load_before} before the campaign, ${load_after} after it. Conditions: ${conditions}."
  echo
  echo "-ncmoe and -ot exps=CPU are parity by construction without a GPU: every tensor already lives in host RAM,"
  echo "so moving expert tensors to CPU moves nothing; on a GPU box they decide how many layers' experts cross from"
  echo "host RAM each token, and the roofline above is the line decode approaches."; } >> "$out/REPORT.md"
echo "campaign wall time: ${wall} s"
