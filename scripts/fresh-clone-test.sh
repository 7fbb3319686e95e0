#!/usr/bin/env bash
# The CI command on fresh clones, N times in a row: each run clones the current HEAD into a new
# temporary directory outside the repository and runs `bash .ci/run` there (about 25 minutes
# on 2 cores). Per run it prints the pytest summary line and the wall time; it exits non-zero
# when any run fails. The clones are removed unless --keep is given.
#
#   bash scripts/fresh-clone-test.sh [N=3] [--keep] [--dry-run]
#
# --dry-run prints what each run would do and runs nothing; N=0 only checks the repository.
set -euo pipefail

usage() { echo "usage: bash scripts/fresh-clone-test.sh [N] [--keep] [--dry-run]" >&2; exit 2; }
n=3 keep=0 dry=0
for a in "$@"; do
  case "$a" in
    --keep) keep=1 ;;
    --dry-run) dry=1 ;;
    -h|--help) usage ;;
    *) [[ "$a" =~ ^[0-9]+$ ]] || { echo "fresh-clone-test: N must be a whole number, got '$a'" >&2; usage; }
       n=$a ;;
  esac
done

repo=$(git -C "$(dirname "${BASH_SOURCE[0]}")/.." rev-parse --show-toplevel)
head=$(git -C "$repo" rev-parse HEAD)
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]; then
  echo "fresh-clone-test: note: uncommitted changes in $repo are not tested (the clone is of HEAD $head)" >&2
fi
echo "fresh-clone-test: $n run(s) of 'bash .ci/run' on fresh clones of $head"

failed=0
for ((i = 1; i <= n; i++)); do
  if [ "$dry" -eq 1 ]; then
    echo "[run $i/$n] would: git clone --no-hardlinks $repo <tmpdir>; git checkout $head; bash .ci/run"
    continue
  fi
  dir=$(mktemp -d "${TMPDIR:-/tmp}/offload-tuner-fresh-XXXXXX")
  log="$dir.log"
  t0=$(date +%s)
  rc=0
  { git clone -q --no-hardlinks "$repo" "$dir/repo" && git -C "$dir/repo" checkout -q "$head" &&
    (cd "$dir/repo" && bash .ci/run); } >"$log" 2>&1 || rc=$?
  wall=$(( $(date +%s) - t0 ))
  summary=$(grep -E '^=*.*[0-9]+ (passed|failed|error|errors)\b.* in [0-9.]+s' "$log" | tail -1 | sed 's/^=* *//; s/ *=*$//')
  printf '[run %d/%d] rc=%d wall=%dm%02ds %s (log %s)\n' "$i" "$n" "$rc" $((wall / 60)) $((wall % 60)) \
    "${summary:-no pytest summary line}" "$log"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
  [ "$keep" -eq 1 ] || rm -rf "$dir"
done
if [ "$dry" -eq 1 ]; then
  echo "fresh-clone-test: dry run: nothing was cloned or run"
  exit 0
fi
if [ "$failed" -gt 0 ]; then
  echo "fresh-clone-test: $failed of $n run(s) failed" >&2
  exit 1
fi
echo "fresh-clone-test: $n of $n run(s) green"
