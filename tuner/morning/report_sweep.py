"""The concurrency-sweep section of the morning report (a ``goodput_at_slo`` campaign, or any arm
measured with ``measure.sweep``): per arm, its goodput at the SLO and the level it was reached at,
the knee, and each level's req/s with its TTFT and TPOT p95 against the SLO (arms.sweep).
No section when no arm was swept."""
from __future__ import annotations

import pandas as pd

from arms.sweep import MAX_ERROR_SHARE, SweepPlan
from tuner.morning.report_model import Section, missing

ROWS = 25


def _ms(v) -> str:
    return "—" if missing(v) else (f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.2f} s")


def _level_cell(lv: dict) -> str:
    mark = "meets" if lv.get("meets_slo") else "misses"
    errs = f", {lv['errors']} failed" if lv.get("errors") else ""
    return (f"{lv.get('req_s', 0):.2f} req/s, TTFT p95 {_ms(lv.get('ttft_p95_s'))}, "
            f"TPOT p95 {_ms(lv.get('tpot_p95_s'))}{errs}: {mark} the SLO")


def sweep(b, df: pd.DataFrame) -> Section | None:
    swept = {}
    for n, a in b.arms.items():
        sw = (((a.end or {}).get("measurement") or {}).get("sweep"))
        if isinstance(sw, dict) and sw.get("levels"):
            swept[n] = sw
    if not swept:
        return None
    s = Section("Concurrency sweep")
    first = next(iter(swept.values()))
    slo = first.get("slo") or {}
    s.add("p", f"Each swept arm served every concurrency level for {first.get('duration_s', 0):g} s of "
               f"{first.get('output_tokens', '?')}-token requests back to back. The SLO: TTFT p95 within "
               f"{_ms(slo.get('ttft_p95_s'))} and TPOT p95 within {_ms(slo.get('tpot_p95_s'))} (at most "
               f"{MAX_ERROR_SHARE * 100:g} % of a level's requests failed); goodput is the req/s of the requests "
               "that met it, the arm's goodput the best among the levels that met it, the knee the lowest level "
               f"within {SweepPlan.knee_tolerance * 100:g} % of the best req/s.")
    words = dict(zip(df["arm"], df["words"]))
    levels = sorted({lv["concurrency"] for sw in swept.values() for lv in sw["levels"]})
    inc_arms = {n for n in b.inc_arm.values() if n is not None}
    rows = []
    for n in sorted(swept, key=lambda n: -(swept[n].get("goodput_at_slo") or 0))[:ROWS]:
        sw = swept[n]
        row = {"Arm": words.get(n, f"#{n}") + (" (incumbent)" if n in inc_arms else ""),
               "goodput at SLO": (f"{sw['goodput_at_slo']:.2f} req/s at {sw.get('goodput_level')}"
                                  if sw.get("goodput_at_slo") else "none: no level met the SLO"),
               "knee": "—" if sw.get("knee") is None else str(sw["knee"])}
        by = {lv["concurrency"]: lv for lv in sw["levels"]}
        for c in levels:
            row[f"concurrency {c}"] = _level_cell(by[c]) if c in by else "—"
        rows.append(row)
    s.add("table", pd.DataFrame(rows))
    if len(swept) > ROWS:
        s.add("p", f"… and {len(swept) - ROWS} more swept arms (`tuner export`).")
    return s
