"""The sections of the morning report, as plain blocks (see ``tuner.morning.report.Section``);
the headline and "How sure" are tuner.morning.report_headline's.

Every table is a pandas DataFrame of display strings; every group of rows past a cap becomes
one line of counts, so a 10,000-arm night gives a report of the same size as a 50-arm one.
"""
from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pandas as pd

from tuner.morning.report_model import (FAILURE_EXAMPLES, GROUPS, MEMORY_ROWS, ROWS_PER_GROUP, TELEMETRY_ARMS, Section, _num,
                                        _pct, missing)


def _fmt_tokens(v) -> str:
    return "—" if missing(v) else f"{int(v):,}"


def arm_table(b, df: pd.DataFrame) -> Section:
    s = Section("Arms")
    s.add("p", f"Decode tok/s at each depth (median of the runs), spec-decode acceptance, time to first token, "
               f"and what the arm came to. Grouped as the night decided; at most {ROWS_PER_GROUP} rows per group.")
    ttft_cols = [f"ttft_{d}" for d in b.depths]
    for g in GROUPS:
        part = df[df["group"] == g]
        if part.empty:
            continue
        shown = part.head(ROWS_PER_GROUP)
        t = pd.DataFrame({"Arm": shown["words"]})
        bad = shown["verdict"] == "corrupt"
        for d in b.depths:
            t[f"decode@{d}"] = [f"({_num(v)}*)" if c and not missing(v) else _num(v)
                                for v, c in zip(shown[f"decode_{d}"], bad)]
        t["acceptance"] = shown["acceptance"].map(lambda v: _pct(v, signed=False))
        if b.depths:
            t[f"TTFT s ({' / '.join(b.depths)})"] = shown[ttft_cols].apply(
                lambda r: " / ".join(_num(v) for v in r), axis=1) if ttft_cols else ""
        t["verdict"] = shown["verdict_words"]
        s.add("h3", f"{g} ({len(part):,})")
        s.add("table", t)
        if bad.any():
            s.add("p", "\\* measured on text the quality guard rejected: invalid by construction, never a result.")
        rest = part.iloc[ROWS_PER_GROUP:]
        if len(rest):
            s.add("p", _summary(rest, g))
    running = df[df["group"].isna()]
    if len(running):
        s.add("p", "Running now: " + ", ".join(running["words"].head(5)) + ".")
    return s


def _summary(rest: pd.DataFrame, what: str) -> str:
    obj = rest["objective"].dropna()
    span = f"objective {obj.min():.2f}–{obj.max():.2f}; " if len(obj) else ""
    levers = Counter(rest["change_lever"].fillna("(incumbent)")).most_common(5)
    return (f"… and {len(rest):,} more in “{what}” ({span}by lever: "
            + ", ".join(f"{k} {n:,}" for k, n in levers) + "). `tuner export` lists every arm.")


def _gib(v) -> str:
    return "n/a" if v is None else f"{v / 2**30:.2f} GiB"


def _delta(v, ref, fmt) -> str:
    if missing(v):
        return "—"
    if missing(ref) or ref == v:
        return fmt(v)
    d = v - ref
    return f"{fmt(v)} ({'+' if d > 0 else '−'}{fmt(abs(d))})"


def memory(b, df: pd.DataFrame) -> Section:
    s = Section("Memory plan")
    from tuner.morning.render import plan_rows

    inc_n = b.inc_arm.get(b.st.incumbent.key())
    inc = b.arms.get(inc_n) if inc_n is not None else None
    rep = (((inc.end or {}).get("boot") or {}).get("report") if inc else None) or {}
    if rep:
        ns = SimpleNamespace(**{k: rep.get(k) for k in ("plan", "kv_pool_tokens", "max_concurrency", "max_concurrency_len",
                                                         "compile_s", "compile_cache_hit", "model_load_gib",
                                                         "model_load_s", "init_engine_s")})
        s.add("p", f"The incumbent's plan at the end of the night (arm #{inc_n}, from the engine's own log):")
        s.add("table", pd.DataFrame(plan_rows(ns), columns=["region", "size"]))
    shown = df[df["boot_outcome"].notna()].head(MEMORY_ROWS)
    ref_of = {n: b.inc_arm.get(b.arms[n].incumbent) for n in shown["arm"]}
    inc_arms = {n for n in b.inc_arm.values() if n is not None}
    cols = {"slots": ("slots", _fmt_tokens), "KV tokens": ("kv_pool_tokens", _fmt_tokens),
            "max concurrency": ("max_concurrency", lambda v: f"{v:.2f}x"),
            "graphs GiB": ("graphs_gib", lambda v: f"{v:.2f}"), "overhead GiB": ("overhead_gib", lambda v: f"{v:.2f}")}
    idx = df.set_index("arm")
    # an engine that logs no compile time of its own (vLLM's CPU build) compiles inside "init engine"
    init_only = bool(df["compile_s"].isna().all() and df["init_engine_s"].notna().any())
    rows = []
    for r in shown.itertuples(index=False):
        ref = None if r.arm in inc_arms else ref_of.get(r.arm)
        out = {"Arm": r.words + (" (incumbent)" if r.arm in inc_arms else "")}
        for name, (col, fmt) in cols.items():
            rv = idx.at[ref, col] if ref is not None and ref in idx.index else None
            out[name] = _delta(getattr(r, col), rv, fmt)
            if col == "graphs_gib":
                out["graphs"] = _fmt_tokens(r.graphs_count)
        out["boot s"] = _num(r.boot_s, 1)
        out["compile s"] = _num(r.compile_s, 1)
        if init_only:
            out["init engine s"] = _num(r.init_engine_s, 1)
        hit = r.compile_cache_hit
        out["compile cache"] = "—" if missing(hit) else ("hit" if hit else "miss")
        rows.append(out)
    s.add("p", "Each arm's plan against the incumbent it was judged against (absolute, then the difference), "
               "and its boot and compile time" + (" (the engine logs no compile time of its own: its compile is "
                                                  "inside the init engine time)" if init_only else "") + ":")
    s.add("table", pd.DataFrame(rows))
    more = int(df["boot_outcome"].notna().sum()) - len(shown)
    if more > 0:
        s.add("p", f"… and {more:,} more booted arms (`tuner export` has slots, KV tokens and times for all).")
    return s


def failures(b, df: pd.DataFrame) -> Section:
    s = Section("Failures")
    bad = df[df["group"] == "Failed"]
    if bad.empty:
        return s.add("p", "No arm failed.")
    cls = bad["verdict"].map(lambda v: v.split(":", 1)[1] if v.startswith("boot-failed:") else v)
    for c, part in bad.groupby(cls, sort=False):
        s.add("h3", f"{c} — {len(part):,} arm(s)")
        for r in part.head(FAILURE_EXAMPLES).itertuples(index=False):
            end = b.arms[r.arm].end or {}
            box = (b.arms[r.arm].start or {}).get("box")          # a shared campaign: the box's own folder
            log = f"{box + '/' if box else ''}arms/{r.arm:04d}/boot.log"
            link = f" — [boot log]({log})" if (b.folder / log).exists() else ""
            s.add("p", f"{r.words}{link}")
            lines = list((end.get("boot") or {}).get("evidence") or [])
            if c == "corrupt":
                lines = list((end.get("quality") or {}).get("evidence") or [])
            elif not lines and end.get("reason"):
                lines = [end["reason"]]
            nap = (end.get("boot") or {}).get("flags_not_applied")
            if nap:
                lines.append(f"flags not applied: {', '.join(nap)}")
            if lines:
                s.add("code", "\n".join(str(x) for x in lines[:3]))
        if len(part) > FAILURE_EXAMPLES:
            more = part["arm"].iloc[FAILURE_EXAMPLES:]
            s.add("p", f"… and {len(more):,} more: " + ", ".join(f"#{n}" for n in more.head(20))
                       + (" …" if len(more) > 20 else "") + ".")
    return s


def quality(b, df: pd.DataFrame) -> Section:
    s = Section("Quality guard")
    q = df["quality"].dropna()
    if q.empty:
        return s.add("p", "No arm was measured, so no text was compared.")
    c = Counter(q)
    s.add("p", f"The temperature-0 text of {len(q):,} measured arms was compared with the incumbent's: "
               + ", ".join(f"{n:,} {k}" for k, n in c.most_common()) + ".")
    flagged = df[df["quality"].isin(["corrupt"]) | (df["verdict"] == "corrupt")]
    items = []
    for r in flagged.head(10).itertuples(index=False):
        ev = ((b.arms[r.arm].end or {}).get("quality") or {}).get("evidence") or []
        items.append(f"{r.words}: corrupt — " + ("; ".join(ev[:2]) or "no evidence recorded"))
    if items:
        s.add("ul", items)
    return s


def _best_window(b, shape, arms: list[int]):
    """The latest arm of ``shape`` whose telemetry window completed (else the latest with one)."""
    mine = [n for n in arms if b.shape_of(n) == shape]
    ok = [n for n in mine if b.arms[n].end["telemetry"].get("status") == "ok"]
    return (ok or mine or [None])[-1]


def telemetry(b, df: pd.DataFrame) -> Section:
    s = Section("Telemetry")
    have = [a.n for a in b.finished() if (a.end or {}).get("telemetry")]
    if not have:
        s.add("p", "No telemetry window ran (`measure.telemetry: true` in the campaign arms one per measured arm).")
    else:
        status = Counter(b.arms[n].end["telemetry"].get("status") for n in have)
        s.add("p", f"{len(have):,} arms opened a telemetry window: "
                   + ", ".join(f"{k} {v:,}" for k, v in status.most_common()) + ".")
        picked = []
        for label, shape in (("the start incumbent", b.baseline), ("the end incumbent", b.st.incumbent)):
            n = _best_window(b, shape, have)
            if n is None or n in picked:
                continue
            picked.append(n)
            tel = b.arms[n].end["telemetry"]
            found = list(tel.get("findings") or []) + list((tel.get("headroom") or {}).get("findings") or [])
            s.add("p", f"At {label} ({df.loc[n, 'words']}, window {tel.get('status')}):")
            s.add("ul", found or ["no findings"])
        rest = [n for n in have if n not in picked]
        items = []
        for n in rest[:TELEMETRY_ARMS]:
            tel = b.arms[n].end["telemetry"]
            found = [f for f in tel.get("findings") or [] if not f.startswith(("telemetry window ", "no prefetch"))]
            head = found[0] if found else f"window {tel.get('status')}: {tel.get('reason') or 'no findings'}"
            items.append(f"{df.loc[n, 'words']}: {head}")
        if items:
            s.add("p", "Other arms, the headline finding of each:")
            s.add("ul", items)
        if len(rest) > TELEMETRY_ARMS:
            s.add("p", f"… and {len(rest) - TELEMETRY_ARMS:,} more arms with telemetry "
                       "(`tuner export` has each arm's prefetch precision).")
    inc_n = b.inc_arm.get(b.st.incumbent.key())
    pr = (((b.arms[inc_n].end or {}).get("probes") or {}).get("summary") or {}) if inc_n is not None else {}
    if pr:
        s.add("p", f"Host probes at the incumbent (arm #{inc_n}): {pr.get('samples')} samples; RAM available at least "
                   f"{_gib(pr.get('ram_available_min_bytes'))}, engine RSS peak {_gib(pr.get('engine_rss_peak_bytes'))}, "
                   f"VRAM {pr.get('vram_source') or 'n/a'}, kernel OOM kills {len(pr.get('oom_kills') or [])}.")
    return s


def constraints(b, df: pd.DataFrame) -> Section:
    s = Section("Constraints")
    c = b.constraints
    named = []
    if c.concurrency_tokens:
        named.append(("max_concurrency_at", f"max concurrency ≥ {c.concurrency_min:g}x at {c.concurrency_tokens:,} tokens"))
    if c.boot_seconds_max:
        named.append(("boot_seconds_max", f"boot ≤ {c.boot_seconds_max:g} s"))
    if c.min_slots:
        named.append(("min_slots", f"arena ≥ {c.min_slots:,} slots"))
    if not named:
        return s.add("p", "The campaign set no constraints.")
    inc_n = b.inc_arm.get(b.st.incumbent.key())
    inc_v = ((b.arms[inc_n].end or {}).get("violations") or {}) if inc_n is not None else {}
    broke = Counter(k for a in b.finished() for k in ((a.end or {}).get("violations") or {}))
    items = []
    for key, text in named:
        state = f"**violated** (violation {inc_v[key]:.2f})" if key in inc_v else "met"
        items.append(f"{text}: {state} by the incumbent; broken by {broke.get(key, 0):,} arm(s)")
    return s.add("ul", items)


def plots(b) -> Section:
    s = Section("Plots")
    s.add("img", ("decode_vs_depth", "decode tok/s against depth: the incumbents and the best arms"))
    s.add("img", ("objective", "objective of every arm over the night, the incumbent and its noise band"))
    s.add("img", ("timeline", "timeline of the arms: boot, measure, failure"))
    return s


def sections(b, df: pd.DataFrame, series: list[dict]) -> list[Section]:
    from tuner.morning.report_boxes import boxes
    from tuner.morning.report_headline import decisions, headline
    from tuner.morning.report_roofline import roofline
    from tuner.morning.report_sweep import sweep

    out = [headline(b, df, series), decisions(b, df), boxes(b, df), arm_table(b, df), memory(b, df), sweep(b, df),
           roofline(b, df),
           failures(b, df), quality(b, df), telemetry(b, df), constraints(b, df), plots(b)]
    return [x for x in out if x is not None]

