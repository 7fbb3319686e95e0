#!/usr/bin/env bash
# Install podman (Debian's packages, with runc) when missing, write the container settings this
# kind of machine needs, and start a `podman system service` on a socket of its own.
#   source scripts/podman-service.sh start   -> exports CONTAINER_HOST, PODMAN_SERVICE_PID
#   source scripts/podman-service.sh stop
# Settings: runc (crun fails on hybrid cgroups here), cgroupfs (no systemd), file events,
# host networking, and nofile/nproc ulimits that fit under this host's hard limits (the
# default RLIMIT_NOFILE of 1048576 is refused by the kernel here).
set -euo pipefail 2>/dev/null || true

_tuner_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_tuner_run="${TUNER_RUN_DIR:-$_tuner_root/.run}"

_tuner_install_podman() {
  if command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1; then return 0; fi
  echo "[setup] installing podman and runc from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq podman runc >/dev/null
}

_tuner_write_conf() {
  mkdir -p "$_tuner_run"
  local hn hu
  hn=$(ulimit -Hn); hu=$(ulimit -Hu)
  [ "$hn" = unlimited ] && hn=65536
  [ "$hu" = unlimited ] && hu=65536
  [ "$hn" -gt 65536 ] && hn=65536
  [ "$hu" -gt 16384 ] && hu=16384   # podman itself runs under a lower nproc cap
  cat > "$_tuner_run/containers.conf" <<CONF
# written by scripts/podman-service.sh for the tuner's own podman service
[containers]
default_ulimits = ["nofile=$hn:$hn", "nproc=$hu:$hu"]
netns = "host"
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
}

podman_service_start() {
  _tuner_install_podman
  _tuner_write_conf
  local sock="$_tuner_run/podman-$$.sock"      # one per run: demo and tests may run side by side
  rm -f "$sock"
  CONTAINERS_CONF="$_tuner_run/containers.conf" \
    podman system service --time=0 "unix://$sock" >"$_tuner_run/podman-service-$$.log" 2>&1 &
  export PODMAN_SERVICE_PID=$!
  export CONTAINER_HOST="unix://$sock"
  for _ in $(seq 1 100); do
    if [ -S "$sock" ]; then echo "[setup] podman service on $CONTAINER_HOST (pid $PODMAN_SERVICE_PID)" >&2; return 0; fi
    if ! kill -0 "$PODMAN_SERVICE_PID" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "[setup] podman system service did not start; its log:" >&2
  cat "$_tuner_run/podman-service-$$.log" >&2
  return 1
}

podman_service_stop() {
  if [ -n "${PODMAN_SERVICE_PID:-}" ] && kill -0 "$PODMAN_SERVICE_PID" 2>/dev/null; then
    kill "$PODMAN_SERVICE_PID" 2>/dev/null || true
    wait "$PODMAN_SERVICE_PID" 2>/dev/null || true
  fi
  rm -f "${CONTAINER_HOST#unix://}"
}

case "${1:-}" in
  start) podman_service_start ;;
  stop) podman_service_stop ;;
  "") ;;
  *) echo "usage: source scripts/podman-service.sh start|stop" >&2; return 2 2>/dev/null || exit 2 ;;
esac
