"""The top of the morning report: the answer (``headline``) and what it rests on (``decisions``,
"How sure").

The headline's first lines are what the operator came for at 7 am: the recommendation (the
shape to run, as changes from the production shape, or why none), the gain against the start
with each move's interval and error rate as the night journaled them, and what is still
undecided; "no result" comes first when the night learned nothing (``campaign_end.no_result``).
Then the night: its span — simulated time said as such (``_Builder.clock``) — how it ended, its
verdicts, and the incumbents at start and end. The production shape is named only when the
campaign has a ``production`` section; otherwise it is the campaign's baseline.
"""
from __future__ import annotations

from collections import Counter

import pandas as pd

from arms import values
from tuner.night.records import latest_judged
from tuner.morning.status import baseline_objective
from tuner.morning.status import gain as status_gain
from tuner.morning.report_blocks import (block_lines, boots_short, box_noise, contended_runs, night_drift, steady_lines,
                                         what_it_could_show)
from tuner.morning.report_model import Section, _num, _pct, _span, _when, _words


def headline(b, df: pd.DataFrame, series: list[dict]) -> Section:
    """The answer first: what to run (or why nothing), how sure, what is still undecided; then
    the night (its time said as simulated where it was) and the incumbents at start and end."""
    s = Section("Headline")
    st = b.st
    fin = df[df["verdict"].notna()]
    t0 = b.records[0].get("t") or 0.0
    t1 = b.records[-1].get("t") or t0
    counts = Counter(v.split(":")[0] for v in fin["verdict"])
    ended = (st.ended or {}).get("reason")
    judged = latest_judged(b.records)            # the loop's own numbers, never recomputed here
    end_obj = judged["incumbent_value"] if judged else st.incumbent_value
    start_obj = start_objective(b, df)
    rate = _error_rate(b)
    unmet = b.constraints.unmet(st.incumbent_score)
    diff = [] if unmet else b.baseline.diff(st.incumbent)
    nothing = no_result(b, start_obj)
    if nothing:
        s.add("p", f"**No result:** {nothing['cause']}" + (f" — evidence: `{nothing['evidence']}`"
                                                          if nothing.get("evidence") else "") + ".")
    if nothing:
        s.add("p", f"**Recommendation: keep {b.start_words} as it is** — the night measured nothing to compare "
                   "it with (above); fix the cause and run the night again.")
    elif unmet:
        s.add("p", f"**Recommendation: keep {b.start_words} as it is** — no shape satisfies {'; '.join(unmet)}: "
                   f"the best arm (#{st.incumbent_arm}, violation {st.incumbent_score.violation:.2f}) still breaks "
                   "them, so nothing measured tonight is recommended (relax the constraint, or add the levers that "
                   "reach it: a longer window, a denser KV dtype, a bigger KV pool).")
    elif diff:
        s.add("p", f"**Recommendation: {b.start_words} with the change(s) below** — {b.objective} "
                   f"**{_pct(status_gain(end_obj, start_obj))}** against the start "
                   f"({_num(start_obj)} → {_num(end_obj)} {_unit(b)}); {_how_sure(b, rate)}.")
        s.add("ul", [_words(c) for c in diff])
    else:
        s.add("p", f"**Recommendation: keep {b.start_words} as it is** — no arm beat it beyond the noise band "
                   f"({_band_text(judged, rate)}).")
    und = undecided(b)
    if und:
        s.add("p", f"**Still undecided** ({len(und)}, never promoted: their intervals straddle 0): "
                   + "; ".join(f"{k[0]} → {k[1]} {c['effect']:+.1%} "
                               f"[{c['lo']:+.1%}, {c['hi']:+.1%}]" for k, c in und[:UNDECIDED_SHOWN])
                   + (f"; … and {len(und) - UNDECIDED_SHOWN:,} more" if len(und) > UNDECIDED_SHOWN else "")
                   + " — details under “How sure”.")
    else:
        s.add("p", "**Still undecided:** nothing — every comparison against the final incumbent was decided.")
    simulated, how = b.clock()
    clock = (f"**{_span(t1 - t0)}** of simulated time (a simulated night: the host's virtual clock, not this "
             f"machine's; {how})" if simulated else f"**{_span(t1 - t0)}** of wall time ({how})")
    when = "simulated " if simulated else ""
    s.add("p", f"Campaign **{b.name}**: {len(df):,} arms ({len(fin):,} finished) from {when}{_when(t0)} to "
               f"{_when(t1, day=_when(t0)[:10] != _when(t1)[:10])} — {clock}. Objective `{b.objective}`. "
               + (f"Ended: {ended}." if ended else "The campaign has not ended (still running, or stopped by a crash).")
               + " Verdicts: " + ", ".join(f"{k} {n:,}" for k, n in counts.most_common()) + ".")
    base_arm = b.inc_arm.get(b.baseline.key())
    s.add("p", f"**Incumbent at start:** {b.start_words} (`{b.baseline.key()}`, arm #{base_arm}) — "
               + (f"{_num(start_obj)} {_unit(b)}." if start_obj is not None else "no objective measured."))
    band = _band_text(judged, rate)
    if b.moves:
        m = b.moves[-1]
        ch = m.get("change") or ["?", None]
        ns = [f"#{n}" for n in m.get("confirmed_arms") or [m["arm"]]]
        arms = ", ".join(ns[:-1]) + " and " + ns[-1] if len(ns) > 1 else ns[0]
        change = f"{ch[0]} → {values.text_of(ch[1])} (arms {arms})"
        gain = status_gain(end_obj, start_obj)
        s.add("p", f"**Incumbent at end:** `{st.incumbent.key()}` after {len(b.moves)} move(s), the last {change} — "
                   f"{_num(end_obj)} {_unit(b)}: **{_pct(gain)}** against the start ({band}).")
    else:
        s.add("p", f"**Incumbent at end:** unchanged — no arm beat {b.start_words} beyond the noise band "
                   f"({band}).")
    return s


def start_objective(b, df: pd.DataFrame) -> float | None:
    by_arm = df.sort_values("arm")[["kind", "objective"]]
    return baseline_objective(by_arm.astype(object).where(by_arm.notna(), None).to_dict("records"))


def no_result(b, start_obj: float | None) -> dict | None:
    """{cause, evidence} when the night learned nothing: as journaled (``campaign_end.no_result``),
    else read from the arms — no incumbent moved and no boot of the starting shape gave the
    objective, so nothing was compared with anything."""
    end = (b.st.ended or {}).get("no_result")
    if isinstance(end, dict) and end.get("cause"):
        return end
    start = [a for a in b.finished() if a.kind in ("baseline", "recheck", "start")]
    if b.moves or start_obj is not None or not start:
        return None
    verdicts = Counter(str(a.verdict) for a in start)
    evidence = next((str(x) for a in start for x in ((a.end or {}).get("boot") or {}).get("evidence") or []), None)
    evidence = evidence or next((str(a.end["reason"]) for a in start if (a.end or {}).get("reason")), None)
    return {"cause": f"no boot of the starting shape yielded the objective {b.objective} ({len(start)} boot(s): "
                     + ", ".join(f"{k} {n}" for k, n in verdicts.most_common())
                     + "), so no arm could be compared with it", "evidence": evidence}


UNDECIDED_SHOWN = 4          # undecided changes named in the headline (all of them under "How sure")


def _how_sure(b, rate: float | None) -> str:
    """The moves' intervals and error rates as journaled (the last three; the rest under "How
    sure"), and the final head-to-head against the start where the night ran one."""
    moves = [r for r in b.st.moves if r.get("comparison")]
    inc = b.st.incumbent.key()
    h2h = [r for r in b.st.comparisons if r.get("kind") == "head-to-head" and r.get("incumbent") == inc]
    parts = []
    if h2h:
        c = h2h[-1]["comparison"]
        parts.append(f"head-to-head against the start {c['effect']:+.1%} [{c['lo']:+.1%}, {c['hi']:+.1%}], "
                     f"error rate {c['alpha']:.2g}")

    def one(r):
        c = r["comparison"]
        return f"arm #{r['arm']} {c['effect']:+.1%} [{c['lo']:+.1%}, {c['hi']:+.1%}] at error rate {c['alpha']:.2g}"

    if len(moves) == 1:
        parts.append(f"the move ({one(moves[0])}) against the shape it replaced")
    elif moves:
        earlier = f" (and {len(moves) - 3} earlier, under “How sure”)" if len(moves) > 3 else ""
        parts.append("each move against the shape it replaced: " + ", ".join(one(r) for r in moves[-3:]) + earlier)
    if not parts:
        parts.append("no interval journaled (moved by the constraints, or a journal from an older tuner)")
    fam = f"; promotions at a family error rate of {rate:g}" if rate is not None else ""
    return "; ".join(parts) + fam


def undecided(b) -> list[tuple[tuple[str, str], dict]]:
    """((lever, value text), the last comparison) of each change whose last comparison against the
    final incumbent was undecided, in the order they were first compared."""
    last: dict = {}
    inc = b.st.incumbent.key()
    for r in b.st.comparisons:
        if r.get("change") and r["incumbent"] == inc:
            last[(r["change"][0], values.text_of(r["change"][1]))] = r["comparison"]
    return [(k, c) for k, c in last.items() if c["verdict"] == "undecided"]


def _unit(b) -> str:
    return "tok/s" if b.objective.startswith("decode") else ("req/s" if b.objective == "goodput_at_slo" else "")


def _error_rate(b) -> float | None:
    """The night's family error rate as journaled (campaign_end; else the campaign it started with)."""
    end = b.st.ended or {}
    if end.get("error_rate") is not None:
        return end["error_rate"]
    return b.camp.noise.error_rate


def _band_text(judged: dict | None, error_rate: float | None) -> str:
    if not judged:
        return "noise band not journaled (a journal from an older tuner)"
    rate = f", promotions at a family error rate of {error_rate:g}" if error_rate is not None else ""
    return (f"noise band ±{judged['noise_band']:.1%} from {judged['measures']} measures of the incumbent; "
            f"a change had to beat ±{judged['band']:.1%}{rate}")


def _cmp_row(c: dict) -> list[str]:
    out = [f" ({n} disturbed left out)" if n else "" for n in c.get("disturbed") or (0, 0)]
    return [f"{c['runs'][0]:,} runs / {c['boots'][0]} boot(s){out[0]}",
            f"{c['runs'][1]:,} runs / {c['boots'][1]} boot(s){out[1]}",
            f"{c['effect']:+.1%} [{c['lo']:+.1%}, {c['hi']:+.1%}]", f"{c['alpha']:.2g}"]


def decisions(b, df: pd.DataFrame) -> Section:
    """What each promotion rested on (the journaled comparisons), the closing head-to-head
    against the starting shape, and the challengers the night could not decide."""
    s = Section("How sure")
    cols = ["runs, challenger", "runs, incumbent", "difference [interval]", "error rate"]
    moves = [r for r in b.st.moves if r.get("comparison")]
    if moves:
        rows = [[f"arm {r['arm']}", f"{r['change'][0]} → {values.text_of(r['change'][1])}", *_cmp_row(r["comparison"])]
                for r in moves]
        s.add("table", pd.DataFrame(rows, columns=["move", "change", *cols]))
    for r in moves:
        lines = block_lines(b, r["comparison"])
        if lines:
            s.add("p", f"Arm {r['arm']}'s move rests on {len(lines)} block(s) of boots in time order:")
            s.add("ul", lines)
    drift = night_drift(b)
    if drift:
        s.add("p", drift)
    warm, unstable = steady_lines(b)
    if warm:
        s.add("p", warm)
    if unstable:
        s.add("p", "Unstable (the rate never settled within the boot: never promoted, never called worse):")
        s.add("ul", unstable)
    held = contended_runs(b)
    if held:
        s.add("p", f"{held} run(s) were taken while another process held the box; they were left out of the "
                   "comparisons.")
    h2h = [r for r in b.st.comparisons if r.get("kind") == "head-to-head"]
    if h2h:
        c = h2h[-1]["comparison"]
        s.add("p", f"Final head-to-head, the incumbent against the starting shape: {c['effect']:+.1%} "
                   f"[{c['lo']:+.1%}, {c['hi']:+.1%}] over {c['runs'][0]:,} vs {c['runs'][1]:,} runs "
                   f"({c['boots'][0]} vs {c['boots'][1]} boots).")
    could = what_it_could_show(b)
    if could:
        s.add("p", could)
    und = undecided(b)
    if und:
        noise = box_noise(b)
        s.add("p", "Undecided (never promoted; their measurements did not settle):")
        s.add("ul", [f"{k[0]} → {k[1]}: {c['effect']:+.1%} [{c['lo']:+.1%}, {c['hi']:+.1%}], spread of one run "
                     f"{(c['sigma'][0] or 0):.1%} vs the incumbent's {(c['sigma'][1] or 0):.1%}, "
                     f"{c['boots'][0]} boot(s){boots_short(noise, c)}" for k, c in und])
    end = b.st.ended
    if end and end.get("reason"):
        s.add("p", f"The night ended: {end['reason']}.")
    return s
