#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU, Release, ggml/llama linked statically) from the source vendored in the
# llama-cpp-python sdist on PyPI, into a cache OUTSIDE the repo, and print the binary's path
# as the last line of stdout. Idempotent: a cached binary is printed at once.
#
#   OFFLOAD_TUNER_CACHE   cache root (default /var/cache/offload-tuner)
#   LLAMA_CPP_PY_VERSION  sdist version (default 0.3.36, which vendors llama.cpp 0c1e5709)
#   PYTHON                interpreter whose pip fetches the sdist (default: the repo's .venv)
#   JOBS                  parallel compile jobs (default 2)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${LLAMA_CPP_PY_VERSION:-0.3.36}"
cache="${OFFLOAD_TUNER_CACHE:-/var/cache/offload-tuner}/llama-server/$version"
bin="$cache/llama-server"

if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

py="${PYTHON:-$root/.venv/bin/python}"
[ -x "$py" ] || py="$(command -v python3)"
for tool in cmake c++ tar flock; do
  command -v "$tool" >/dev/null || { echo "[llama-server] missing build tool: $tool" >&2; exit 1; }
done

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # a concurrent run builds; wait for it, then reuse its binary
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
rm -rf "$cache"/.build.*  # leftovers of a killed run (we hold the lock)
work="$(mktemp -d "$cache/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
start=$SECONDS

# 1. the sdist (an install step: the only network access)
echo "[llama-server] fetching llama-cpp-python==$version sdist" >&2
"$py" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work/dl" >&2
sdist="$(ls "$work"/dl/llama_cpp_python-*.tar.gz | head -1)"
tar -xzf "$sdist" -C "$work"
src="$(ls -d "$work"/llama_cpp_python-*/vendor/llama.cpp)"
[ -f "$src/tools/server/CMakeLists.txt" ] \
  || { echo "[llama-server] $sdist has no vendored llama.cpp server" >&2; exit 1; }

# 2. configure: CPU only, portable, static, no UI download, no HTTPS/curl, no tests/examples
echo "[llama-server] configuring" >&2
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$work/configure.log" 2>&1 \
  || { tail -n 40 "$work/configure.log" >&2; exit 1; }

# 3. build only the server target
echo "[llama-server] building (jobs=${JOBS:-2})" >&2
cmake --build "$work/build" --target llama-server -j "${JOBS:-2}" >"$work/build.log" 2>&1 \
  || { tail -n 40 "$work/build.log" >&2; exit 1; }

# 4. install atomically: the binary appears only once complete
built="$work/build/bin/llama-server"
"$built" --version >&2 2>&1 || { echo "[llama-server] built binary does not run" >&2; exit 1; }
cp "$built" "$bin.tmp.$$"
mv -f "$bin.tmp.$$" "$bin"
echo "[llama-server] built in $((SECONDS - start)) s" >&2
echo "$bin"
