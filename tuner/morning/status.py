"""`tuner status`: what a campaign has done, for a person (80 columns) and for a program (--json).

``status_data`` reads a campaign folder back (journal, daemon pid, the live phase file the
running daemon keeps) into one JSON-able dict; ``render`` writes it for a terminal: a summary
line first, then a narrow table (``--wide``: the full one). Pruned arms and better-but-not-yet-
confirmed arms are said as such.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from arms.errors import ConfigError

from arms import values
from tuner.night.schema import Journaled

PHASE_FILE = "phase.json"        # written by the running daemon (tuner/morning/liveview.py)


def label(arm, arms=()) -> str:
    """What happened to one arm, in words: pruned and unconfirmed are said as such (``arms``:
    every arm of the night, to find the confirmation of a better probe)."""
    e = arm.end or {}
    v = e.get("verdict")
    if v is None:
        return "running"
    reason = e.get("reason") or ""
    if v == "worse" and reason.startswith("pruned"):
        return "pruned"
    if v == "better" and arm.kind == "probe":
        conf = next((a for a in arms if a.kind == "confirm" and a.n > arm.n and a.change == arm.change
                     and a.incumbent == arm.incumbent and a.end), None)
        if conf is None:
            return "better (unconfirmed)"
        return "better (confirmed)" if conf.verdict == "better" else "better (not confirmed)"
    return v


def incumbent_changes(st) -> list[str]:
    """The incumbent as changes from the baseline (not a hash)."""
    if st.incumbent is None:
        return []
    base = st.baseline
    try:
        from dataclasses import replace

        return [c.describe() for c in replace(base, image=st.incumbent.image).diff(st.incumbent)]
    except Exception:  # noqa: BLE001 - an older journal's shape: the key says enough
        return [st.incumbent.key()]


def _deadline(records: list[dict], start: dict) -> float | None:
    """The night's deadline: the one its campaign_start journaled (fixed when the night started;
    a resume keeps it), or for an older journal the one its budget gives from the night's start
    (never from a resume: a re-read or a resume of a finished night does not move it)."""
    if start.get("deadline") is not None or "deadline" in start:
        return start.get("deadline")
    from tuner.night.campaign import Budget
    from tuner.night.ending import budget_deadline

    budget = Journaled(start.get("campaign")).budget
    try:
        until = tuple(int(x) for x in str(budget.until).strip().split(":")) if budget.until else None
    except (TypeError, ValueError):
        return None
    hours = None if budget.hours is None else float(budget.hours)
    return budget_deadline(Budget(until=until, hours=hours, timezone=budget.timezone), start.get("t"))


def status_data(folder: Path) -> dict:
    from arms.shape import Shape
    from tuner.night.readback import daemon_pid, load_records, read_records, shared_of, start_of
    from tuner.night.records import latest_judged
    from tuner.night.state import replay

    jpath = folder / "journal.jsonl"
    if not jpath.exists() and shared_of(folder) is None:
        raise ConfigError(f"{folder} holds no journal.jsonl: the campaign has not run yet (`tuner run CAMPAIGN`)")
    # a reader: no lock, never writes (the daemon may be mid-line); a shared campaign: its database
    records = read_records(jpath) if jpath.exists() else load_records(folder)
    start = start_of(records)
    if start is None:
        raise ConfigError(f"{jpath} has no campaign_start record")
    st = replay(records, Shape.from_dict(start["baseline"]))
    camp = Journaled(start.get("campaign"))
    pid = daemon_pid(folder)
    running = st.open_arms
    phase = None
    pf = folder / PHASE_FILE
    if pid and pf.exists():
        try:
            phase = json.loads(pf.read_text())
        except (OSError, ValueError):
            phase = None
    arms = []
    names = _names(st)
    for a in sorted(st.arms.values(), key=lambda a: a.n):
        e = a.end or {}
        arms.append({"arm": a.n, "kind": a.kind, "change": None if not a.change else values.change_text(a.change),
                     "change_short": None if not a.change else names.change(*a.change),
                     "verdict": e.get("verdict"), "label": label(a, st.arms.values()),
                     "objective": (e.get("score") or {}).get("objective"), "delta": e.get("delta"),
                     "boot_s": (e.get("boot") or {}).get("boot_s"), "reason": e.get("reason")})
    base_obj = baseline_objective(arms)
    judged = latest_judged(records)
    inc_obj = judged["incumbent_value"] if judged else st.incumbent_value     # as the loop journaled it
    ended = st.ended or {}
    boxes = None
    if shared_of(folder) is not None and not jpath.exists():     # a shared campaign: its boxes' heartbeats
        from tuner.night.readback import shared_boxes

        grace = float(((start.get("campaign") or {}).get("storage") or {}).get("grace_s", 120.0)) \
            if isinstance((start.get("campaign") or {}).get("storage"), dict) else 120.0
        boxes = [{**b, "live": b["left"] is None and b["heartbeat"] is not None and b["now"] - b["heartbeat"] < grace,
                  "arms": sum(a.box == b["box"] for a in st.arms.values()),
                  "running_arm": next((a.n for a in running if a.box == b["box"]), None)}
                 for b in shared_boxes(folder)]
        pid = pid or (any(b["live"] for b in boxes) or None)
    if ended and not (boxes and any(b["live"] for b in boxes)):
        state = "ended"
    elif pid and running:
        state = "running"
    elif pid:
        state = "running"
    elif running:
        state = "interrupted"
    else:
        state = "stopped"
    deadline = _deadline(records, start)
    return {
        "folder": str(folder), "campaign": camp.name or folder.name, "state": state,
        "arms": len(st.arms), "arm_list": arms,
        "daemon_pid": pid if pid is not True else None, "boxes": boxes,
        "running_arm": running[0].n if running and pid else None,
        "interrupted_arm": running[0].n if running and not pid else None,
        "phase": (phase or {}).get("phase") or ("ended" if ended else None),
        "objective": camp.objective,
        "baseline_objective": base_obj, "incumbent_objective": inc_obj,
        "gain": gain(inc_obj, base_obj), "judged": judged,
        "error_rate": ended.get("error_rate", camp.noise.error_rate),
        "incumbent": st.incumbent.key() if st.incumbent else None, "incumbent_arm": st.incumbent_arm,
        "incumbent_changes": incumbent_changes(st),
        "started": start.get("t"), "deadline": deadline,
        "max_arms": camp.budget.max_arms,
        "ended": ended.get("reason"), "verdict": ended.get("verdict"), "no_result": ended.get("no_result"),
        "counts": _counts(arms),
    }


def _names(st):
    """The night's lever values, named apart (tuner.morning.change_names)."""
    from tuner.morning.change_names import ValueNames

    pairs = [a.change for a in st.arms.values() if a.change]
    pairs += [(lever, st.baseline.value_of(lever)) for lever in {c[0] for c in pairs}]
    return ValueNames(pairs)


def baseline_objective(arms: list[dict]) -> float | None:
    """The production shape's objective: its first measured baseline arm's (rows with kind and
    objective, as ``status_data``'s arm list or ``tuner.morning.export``'s frame)."""
    return next((x["objective"] for x in arms if x["kind"] == "baseline" and x["objective"] is not None), None)


def gain(inc_obj: float | None, base_obj: float | None) -> float | None:
    return (inc_obj / base_obj - 1) if inc_obj and base_obj else None


def _counts(arms: list[dict]) -> dict:
    out: dict[str, int] = {}
    for a in arms:
        out[a["label"]] = out.get(a["label"], 0) + 1
    return out


def _clock(ts: float | None) -> str:
    return "n/a" if ts is None else time.strftime("%H:%M", time.localtime(ts))


def summary_line(d: dict) -> str:
    gain = "" if d["gain"] is None else f" ({d['gain']:+.1%} vs baseline)"
    obj = "n/a" if d["incumbent_objective"] is None else f"{d['incumbent_objective']:.2f}"
    what = {"running": f"running arm {d['running_arm']}" if d["running_arm"] is not None else "running",
            "ended": "ended, no result" if d.get("no_result") else "ended", "interrupted": f"interrupted in arm {d['interrupted_arm']}",
            "stopped": "stopped"}[d["state"]]
    budget = f"/{d['max_arms']}" if d.get("max_arms") else ""
    dl = f"; deadline {_clock(d['deadline'])}" if d["deadline"] and d["state"] == "running" else ""
    return f"{d['campaign']}: {what}; {d['arms']}{budget} arms; {d['objective']} {obj}{gain}{dl}"


def render(d: dict, width: int = 80, wide: bool = False) -> str:
    """The status for a terminal ``width`` columns wide; no line is wider."""
    out = [summary_line(d)]
    inc = d["incumbent_changes"]
    out.append("incumbent: " + ("the baseline" if not inc else "; ".join(inc))
               + (f" (arm {d['incumbent_arm']})" if d["incumbent_arm"] is not None and inc else ""))
    counts = d["counts"]
    if counts:
        out.append("arms: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])))
    if d.get("phase") and d["state"] == "running":
        out.append(f"now: {d['phase']}")
    if d["state"] == "interrupted":
        out.append(f"arm {d['interrupted_arm']} was interrupted (no daemon alive): `tuner run` resumes it")
    if d.get("ended"):
        out.append(f"ended: {d['ended']}")
    if d.get("verdict"):
        out.append(f"verdict: {d['verdict']}")
    out = [w for line in out for w in _wrap(line, width)]
    out.append("")
    out += _table(d["arm_list"], width, wide)
    if not wide:
        out.append("(--wide: every column; --json: everything)")
    return "\n".join(out)


def _wrap(line: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(line, width, subsequent_indent="  ", break_on_hyphens=False) or [""]


def _table(arms: list[dict], width: int, wide: bool) -> list[str]:
    def obj(a):
        return "" if a["objective"] is None else f"{a['objective']:.2f}"

    def delta(a):
        return "" if a["delta"] is None else f"{a['delta']:+.1%}"

    def boot(a):
        return "" if a["boot_s"] is None else f"{a['boot_s']:.0f}"

    def change(a):
        return (a["change"] if wide else a.get("change_short") or a["change"]) or "—"

    cols = [("arm", lambda a: str(a["arm"]), ">"), ("kind", lambda a: a["kind"], "<"),
            ("change", change, "<"), ("verdict", lambda a: a["label"], "<"),
            ("obj", obj, ">"), ("Δ", delta, ">")]
    if wide:
        cols += [("boot s", boot, ">"), ("reason", lambda a: a["reason"] or "", "<")]
    rows = [[f(a) for _, f, _ in cols] for a in arms]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, (h, _, _) in enumerate(cols)]
    if not wide:                  # the change column takes what the others leave of `width`
        names = [c[0] for c in cols]
        widths[names.index("verdict")] = min(widths[names.index("verdict")], 22)
        fixed = sum(w for i, w in enumerate(widths) if names[i] != "change") + 2 * (len(cols) - 1)
        ci = names.index("change")
        widths[ci] = max(8, min(widths[ci], width - fixed))

    from tuner.morning.change_names import fit

    for i, _ in enumerate(cols):          # cut each column so that different cells stay different
        for r, c in zip(rows, fit([r[i] for r in rows], widths[i])):
            r[i] = c

    def fmt(cells):
        parts = []
        for (h, _, align), w, c in zip(cols, widths, cells):
            parts.append(c.rjust(w) if align == ">" else c.ljust(w))
        return "  ".join(parts).rstrip()

    return [fmt([h for h, _, _ in cols])] + [fmt(r) for r in rows]


def print_status(ns) -> int:
    import shutil

    from tuner.night.readback import folder_of

    d = status_data(folder_of(ns.campaign))
    if ns.json:
        print(json.dumps(d, indent=1, default=str))
        return 0
    width = shutil.get_terminal_size((80, 24)).columns
    print(render(d, width=10_000 if ns.wide else max(40, width), wide=ns.wide))
    return 0
