"""Where a fleet's box-hours go (issue 23): the nights of bench/fleet.py, each box's arms up to the
moment the night got within 3 % of the one-change optimum, summed by role. Against one box's
night this shows what more boxes cost beyond the work one box does: every box measures the
start itself and boots each new incumbent itself (its comparisons are blocked by box), so N boxes
pay N - 1 baselines, N - 1 second boots of the start and about N - 1 boots of each move's shape
that one box never needs. Those boots are a floor under the ratio to one box, however the boxes
share the rest: (one box's hours + that tax) / N.

Roles, from each arm's journaled start (kind, change, box) and the moves:
  baseline            the box's first boot of the starting shape
  incumbent boot      a boot of the incumbent (kind recheck): the start's second boot, a bracket
                      closing a block, a re-measure
  winner, first box   the boots on the box that first booted a change that moved, at that incumbent
  winner, other boxes boots of a change that moved, at that incumbent, on any other box (a twin, or
                      a box's boot of the likely next incumbent ahead of its move)
  other challenger    boots of changes that did not move there (probes, their further boots, joins)
  failed boot         an arm that did not boot, or whose output was corrupt
An arm begun ahead of a move is counted at the incumbent it was begun for (its supposed one).

  .venv/bin/python bench/fleet_hours.py [--seeds 10] [--boxes 1,2,4] [--landscapes seed-002,small-spec]
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

import fleet
from simbench import emit

ROLES = ("baseline", "incumbent boot", "winner, first box", "winner, other boxes", "other challenger",
         "failed boot")
TAXED = ("baseline", "incumbent boot", "winner, other boxes")     # the roles every box pays for itself


def roles(recs: list[dict], until_h: float) -> dict[str, float]:
    """Box-hours by role of the arms begun before ``until_h`` (hours into the night), each cut at it."""
    starts = {r["arm"]: r for r in recs if r["op"] == "arm_start"}
    moved = set()
    for r in recs:
        s = starts.get(r["arm"]) if r["op"] == "incumbent" else None
        if s is not None and s.get("change"):
            moved.add((s["incumbent"], str(s["change"])))
    first_box: dict[tuple, str] = {}
    for n in sorted(starts):
        s = starts[n]
        if s.get("change"):
            first_box.setdefault((s["incumbent"], str(s["change"])), s.get("box"))
    out: dict[str, float] = collections.Counter()
    for r in recs:
        s = starts.get(r["arm"]) if r["op"] == "arm_end" else None
        if s is None or s.get("t") is None or r.get("t") is None:
            continue
        t0, t1 = fleet.night_hours(s["t"]), fleet.night_hours(r["t"])
        if t0 >= until_h:
            continue
        verdict = r.get("verdict") or ""
        key = (s["incumbent"], str(s.get("change")))
        if verdict.startswith("boot-failed") or verdict == "corrupt":
            role = "failed boot"
        elif s["kind"] == "baseline":
            role = "baseline"
        elif not s.get("change"):
            role = "incumbent boot"
        elif key in moved:
            role = "winner, first box" if first_box.get(key) == s.get("box") else "winner, other boxes"
        else:
            role = "other challenger"
        out[role] += min(t1, until_h) - t0
    return out


def night(job: tuple[str, int, int]) -> tuple[str, int, int, float, dict]:
    r, recs = fleet.night_records(job)
    hours = r["reached_h"] or fleet._CTX["hours"]
    return (*job, hours, dict(roles(recs, hours)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--hours", type=float, default=8.0)
    ap.add_argument("--boxes", default="1,2,4")
    ap.add_argument("--landscapes", default="seed-002,small-spec")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    names, counts = args.landscapes.split(","), [int(x) for x in args.boxes.split(",")]
    t0 = time.time()
    done = fleet.nights(night, names, args.seeds, counts, hours=args.hours, within=0.03, jobs=args.jobs)
    lines = [f"Command: `cd bench && ../.venv/bin/python fleet_hours.py --seeds {args.seeds} --boxes {args.boxes} "
             f"--landscapes {args.landscapes}` ({time.time() - t0:.0f} s wall). Box-hours per night (mean over "
             f"{args.seeds} nights) up to the night's reach (within 3 % of the optimum; a night that never gets "
             f"there counted to {args.hours:g} h); the tax: what N boxes spend beyond one box on the three roles "
             "every box pays itself (baseline, incumbent boots, the winner's boots on other boxes); the floor: "
             "(one box's hours + tax) / N over one box's hours.", "",
             "| landscape | boxes | hours (median) | ratio (median) | " + " | ".join(ROLES) +
             " | box-hours | tax | floor |", "|---" * (len(ROLES) + 7) + "|"]
    for name in names:
        rows = {n: [d for d in done if d[0] == name and d[2] == n] for n in counts}
        means = {n: {role: statistics.mean(d[4].get(role, 0.0) for d in rows[n]) for role in ROLES} for n in counts}
        one = {d[1]: d for d in rows.get(1, [])}
        h1 = statistics.mean(d[3] for d in one.values()) if one else float("nan")
        for n in counts:
            mean = means[n]
            ratio = statistics.median(d[3] / one[d[1]][3] for d in rows[n]) if one else float("nan")
            tax = sum(mean[r] - means[1][r] for r in TAXED) if one else float("nan")
            lines.append(f"| {name} | {n} | {statistics.median(d[3] for d in rows[n]):.2f} | {ratio:.2f} | "
                         + " | ".join(f"{mean[r]:.2f}" for r in ROLES)
                         + f" | {sum(mean.values()):.2f} | {tax:.2f} | {(h1 + tax) / n / h1:.2f} |")
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
