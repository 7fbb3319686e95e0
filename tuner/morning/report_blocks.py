"""What a non-stationary box did to the night, for "How sure" (tuner.morning.report_headline):
each move's blocks in boot order and time, the drift the night saw, the warm-up left out, the
boots that never settled and the runs another process disturbed. Reads the report's arms
(``b.arms``: every arm's records, ``readback.ArmRecords``) and its replayed decisions (``b.st``).
"""
from __future__ import annotations

import math
from dataclasses import replace

from arms import values
from tuner.night.blocks import Boot, drift_of
from tuner.night.compare import MIN_EFFECT
from tuner.night.power import BoxNoise, boots_for, shown_at
from tuner.night.search import REEXAMINE_CAP


def _hours(b, arm: int) -> str:
    a = b.arms.get(arm)
    t0 = (b.st.started or {}).get("t")
    t = (a.end or {}).get("t") if a is not None else None
    if t is None or t0 is None:
        return "?"
    h = (t - t0) / 3600
    return f"{h:.1f} h" if h >= 1 else f"{h * 60:.0f} min"


def _span_h(b, arms) -> float | None:
    """Hours from the first to the last of ``arms``' ends; None when a time is missing."""
    ts = [((b.arms[a].end or {}).get("t") if a in b.arms else None) for a in arms]
    if not ts or any(t is None for t in ts):
        return None
    return (max(ts) - min(ts)) / 3600


def _drift_text(b, bl: dict) -> str:
    """What the incumbent did across a block: per hour for a block of an hour or more, else how far
    it moved across the block's span (a rate per hour read over minutes says nothing an operator
    can use: a 5 % step between boots 3 minutes apart is "+4000 %/h")."""
    if "drift_per_h" not in bl:
        return ""
    refs, boot = bl.get("ref", ()), bl.get("boot")
    before, after = [r for r in refs if r < boot], [r for r in refs if r > boot]
    # the drift a block saw is the step between the incumbent boots right around the challenger's
    span = _span_h(b, (max(before), min(after))) if before and after else None
    if span is None or span >= 1 or bl["drift_per_h"] <= -1:
        return f", incumbent drift across it {bl['drift_per_h']:+.1%}/h"
    moved = math.expm1(math.log1p(bl["drift_per_h"]) * span)
    return f", the incumbent moved {moved:+.1%} across it ({span * 60:.0f} min)"


def block_lines(b, comparison: dict) -> list[str]:
    """One line per block of a blocked comparison: the challenger's boot, the incumbent boots it was
    read against (arm, hour of the night, weight), its difference, and whether it was closed."""
    out = []
    for bl in comparison.get("blocks") or ():
        refs = ", ".join(f"arm {r} ({_hours(b, r)}, w {w:+.2f})" for r, w in zip(bl.get("ref", ()), bl.get("w", ())))
        state = "jumped: the incumbent moved across it, not counted as closed" if bl.get("jumped") else \
            ("closed" if bl.get("closed") else "open: no incumbent boot after it")
        seen = _drift_text(b, bl)
        out.append(f"boot arm {bl['boot']} ({_hours(b, bl['boot'])}) against {refs}: {bl['diff']:+.1%} — {state}{seen}")
    return out


def night_drift(b) -> str | None:
    """The drift of the box over the night, fitted to every shape's repeated boots (each its own
    level), as one sentence; None when too few shapes were booted twice."""
    series: dict[str, list[Boot]] = {}
    for a in b.arms.values():
        m = (a.end or {}).get("measurement")
        if m and m.get("outcome") == "measured" and a.verdict != "corrupt" and a.end.get("t") is not None:
            key = a.start.get("identity") or str(a.start.get("shape"))
            series.setdefault(key, []).append(Boot.of(a.n, a.end["t"] / 3600.0, m))
    d = drift_of(list(series.values()))
    if d is None:
        return None
    clear = abs(d.per_h) > 2 * d.se
    return (f"Drift over the night: {d.per_h:+.1%}/h ± {d.se:.1%} (fitted to {d.boots} boots of {d.shapes} "
            f"shapes booted more than once){'' if clear else ', not distinguishable from none'}; the comparisons "
            "read each challenger against the incumbent boots around it, so a drift that is linear across a "
            "block cancels.")


PROMOTION_LOOKS = ("bracketed", "closed")    # comparisons of finished boots only: the looks that move a shape


def box_noise(b) -> BoxNoise | None:
    """The last blocked comparison's reading of the box: boot spread, run noise; and the error
    rate the night's last promotion look read (one of finished boots, the only kind that moves a
    shape: a growing boot's own look is open), or the last comparison's when none has yet."""
    comps = [r for r in b.st.comparisons if r.get("comparison")]
    noise = next((n for r in reversed(comps) for n in [BoxNoise.of(r["comparison"])] if n is not None), None)
    promo = next((r["comparison"]["alpha"] for r in reversed(comps)
                  if r.get("kind") in PROMOTION_LOOKS and r["comparison"].get("alpha")), None)
    return noise if noise is None or promo is None else replace(noise, alpha=float(promo))


def what_it_could_show(b) -> str | None:
    """How small a move this box let the night show, from the last blocked comparison's boot
    spread, run noise and error rate (tuner/night/power.py). A box whose boots spread makes small
    moves cost many boots whatever the night does: the operator should hear it beside the answer."""
    noise = box_noise(b)
    if noise is None:
        return None
    s2, a, df = noise.s2, noise.alpha, noise.df
    floor = getattr(getattr(b.camp, "search", None), "min_effect", None) or MIN_EFFECT
    need = boots_for(floor, s2, a, df=df)
    spread = (f"boots of one shape spread {noise.boot_sigma:.1%} beyond their runs' noise (from {noise.pairs} "
              "pair(s) of successive boots)" if noise.boot_sigma > 0 else
              f"boots of one shape agreed to their runs' noise (from {noise.pairs} pair(s) of successive boots)")
    return (f"What this box could show: {spread}, and a boot's mean carries "
            f"{math.sqrt(max(0.0, s2 - noise.boot_sigma ** 2)):.1%} of the runs' own noise. At the night's last "
            f"promotion look's error rate ({a:.2g}), a challenger booted {REEXAMINE_CAP} times between incumbent "
            f"boots shows a move of {shown_at(REEXAMINE_CAP, s2, a, df):+.1%} or more half the time; the smallest "
            f"move worth one ({floor:+.1%}) would need "
            + (f"about {need} boots." if need else "more boots than any night holds."))


def boots_short(noise: BoxNoise | None, c: dict) -> str:
    """What an undecided change's reading would need on this box (empty without a blocked reading)."""
    if noise is None or c.get("boot_sigma") is None or not c.get("effect") or c["effect"] <= 0:
        return ""
    n = boots_for(c["effect"], noise.s2, noise.alpha, df=noise.df)
    if n is None:
        return "; a reading that small would need more boots than any night holds"
    more = n - (c.get("boots") or [0])[0]
    if more <= 0:
        return "; at the box's spread its boots would show it, but its own interval is wider (open blocks, its own spread)"
    return f"; about {more} more boot(s) would show a reading that large half the time"


def steady_lines(b) -> tuple[str | None, list[str]]:
    """(a sentence on the warm-up runs left out, one line per arm whose boot never settled)."""
    warm_runs = warm_boots = 0
    unstable = []
    for a in sorted(b.arms.values(), key=lambda a: a.n):
        s = (a.end or {}).get("steady") or {}
        n = sum((s.get("warmup") or {}).values())
        if n:
            warm_runs, warm_boots = warm_runs + n, warm_boots + 1
        if s.get("unstable"):
            runs = []
            for d, r in (((a.end or {}).get("measurement") or {}).get("depths") or {}).items():
                xs = [x.get("decode_tok_s") for x in r.get("runs") or [] if x.get("valid")]
                runs.append(f"@{d}: " + " ".join(f"{x:.1f}" for x in xs if x))
            change = f"{a.change[0]} → {values.text(a.change[1])}" if a.change else a.kind
            unstable.append(f"arm {a.n} ({change}): {s['unstable']}; runs {'; '.join(runs)}")
    warm = (f"Warm-up left out: {warm_runs} run(s) in {warm_boots} boot(s) read below their boot's settled "
            "rate at its start (arms.steady), and were not compared." if warm_runs else None)
    return warm, unstable


def contended_runs(b) -> int:
    """Runs the night's comparisons left out because another process held the box during them."""
    return sum(sum(r.get("comparison", {}).get("contended") or (0, 0)) for r in b.st.comparisons)
