"""What a box did during a night, as the simulated engine's landscape keys (issue 19, Build 1):
fit boot_sigma, cold_start, warmup and drift_per_hour to a campaign folder's journal, so the
simulated landscapes can be set to what a real engine measured.

From the journal's measured boots (``State.measured_boots``):
  - boot_sigma: the night's boot-to-boot spread beyond the runs' noise (``blocks.boot_spread``
    over every shape booted more than once: successive boots, steps trimmed);
  - cold_start: the night's first measured boot against the later boots of the same shape (the
    ratio of their mean rates; with the tuner's page-cache read before the first boot this is ~1);
  - warmup: the runs ``arms.steady`` left out as warm-up (how many per boot, and how far below
    the boot's settled rate the first of them ran);
  - drift_per_hour: ``blocks.drift_of`` on the journal's clock.
Each also as the boots it rests on. Contended runs (another process held the box) are left out
first, as the comparisons do.

  .venv/bin/python bench/box_fit.py JOURNAL_FOLDER [--out FILE]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from simbench import emit

from arms.shape import Shape
from arms.steady import steady
from tuner.night.blocks import Boot, boot_spread, drift_of
from tuner.night.readback import campaign_folder, load_records, start_of
from tuner.night.state import replay


def _first_run_factor(m: dict) -> list[float]:
    """Per depth with warm-up: the first run's rate over the depth's settled median."""
    s = steady(m)
    out = []
    for d, n in s.warmup.items():
        runs = [x["decode_tok_s"] for x in (m["depths"][d].get("runs") or [])
                if x.get("valid") and x.get("decode_tok_s") and not x.get("contended")]
        if n and len(runs) > n:
            out.append(runs[0] / statistics.median(runs[n:]))
    return out


def fit(records: list[dict]) -> dict:
    start = start_of(records)
    if start is None or not start.get("baseline"):
        raise SystemExit("box_fit: the journal has no campaign_start with a baseline")
    st = replay(records, Shape.from_dict(start["baseline"]))
    t0 = (start.get("t") or 0.0) / 3600.0
    boots = {k: [(n, h - t0, m) for n, h, m in b] for k, b in st.measured_boots().items()}
    series = [[Boot.of(n, float(n), m, hours=h) for n, h, m in b] for b in boots.values()]
    spread = boot_spread(series)
    by_hours = [[Boot.of(n, h, m) for n, h, m in b] for b in boots.values()]
    drift = drift_of(by_hours)
    out: dict = {"boot_sigma": round(spread.sigma, 4), "boot_pairs": spread.pairs,
                 "drift_per_hour": None if drift is None else round(math.expm1(drift.per_h), 4),
                 "drift_se": None if drift is None else round(drift.se, 4)}
    first = min(((n, k) for k, b in boots.items() for n, _, _ in b), default=None)
    if first is not None:
        n0, key = first
        mine = [Boot.of(n, float(n), m) for n, _, m in boots[key]]
        mine = [b for b in mine if b.runs]
        if len(mine) >= 2 and mine[0].arm == n0:
            depths = sorted(set.intersection(*(set(b.runs) for b in mine)))
            later = statistics.fmean(b.mean(depths) for b in mine[1:])
            out["cold_start_factor"] = round(math.exp(mine[0].mean(depths) - later), 3)
            out["cold_start_against_boots"] = len(mine) - 1
    warm_runs, warm_boots, measured, firsts = 0, 0, 0, []
    for b in boots.values():
        for _, _, m in b:
            measured += 1
            w = steady(m).warmup_runs
            warm_runs += w
            warm_boots += w > 0
            firsts += _first_run_factor(m)
    out.update(boots=measured, warmup_boots=warm_boots, warmup_runs=warm_runs,
               warmup_first_factor=round(statistics.median(firsts), 3) if firsts else None)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=Path, help="a campaign's journal folder, or the campaign's YAML file")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    f = fit(load_records(campaign_folder(args.folder)))
    keys = [f"boot_sigma: {f['boot_sigma']}"]
    if f.get("cold_start_factor") is not None:
        keys.append(f"cold_start: {{factor: {f['cold_start_factor']}, boots: 1}}")
    if f.get("warmup_first_factor") is not None and f["warmup_boots"]:
        per = max(1, round(f["warmup_runs"] / f["warmup_boots"]))
        keys.append(f"warmup: {{requests: {per}, factor: {f['warmup_first_factor']}}}")
    if f.get("drift_per_hour") is not None:
        keys.append(f"drift_per_hour: {f['drift_per_hour']}")
    drift = "–" if f["drift_per_hour"] is None else f"{f['drift_per_hour']:+.1%}/h ± {f['drift_se']:.1%}"
    lines = [f"command: .venv/bin/python bench/box_fit.py {args.folder}", "",
             "| term | value | from |", "|---|---|---|",
             f"| boot-to-boot sigma (beyond the runs' noise) | {f['boot_sigma']:.1%} | {f['boot_pairs']} successive boot pairs |",
             f"| drift | {drift} | every shape booted twice or more, on the journal's clock |",
             f"| first boot of the night / later boots of its shape | {f.get('cold_start_factor', '–')} | "
             f"{f.get('cold_start_against_boots', 0)} later boot(s) |",
             f"| boots with warm-up runs left out | {f['warmup_boots']} of {f['boots']} ({f['warmup_runs']} runs) | arms.steady |",
             f"| first warm-up run / the boot's settled rate | {f['warmup_first_factor'] or '–'} | median over depths with warm-up |",
             "", "As landscape keys (simengine/LANDSCAPE.md):", "", "```yaml", *keys, "```"]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
