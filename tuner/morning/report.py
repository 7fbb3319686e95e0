"""`tuner report`: the morning report of a campaign, from its journal alone.

``build_report(folder)`` reads ``journal.jsonl`` once (plus which boot logs exist) and builds
sections as plain data: a headline, the arm table grouped as in seed 002 (incumbent moves,
baseline and re-checks, unconfirmed wins, parity, worse, failures), the memory plan of each arm
against its incumbent's, failures by class with the engine's own lines, the quality guard,
telemetry findings, constraints, and the inputs of three plots. ``render_markdown`` and
``render_html`` (``tuner.morning.report_render``) turn the same sections into REPORT.md and a
self-contained report.html. Everything is one pass over the arms: 10,000 arms render in seconds,
because tables summarise beyond a few rows per group and the plots cap what they draw.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from arms.errors import ConfigError
from arms.shape import ABSENT, Change, Shape

from arms import values
from tuner.morning.change_names import ValueNames, fit
from tuner.morning.export import arms_frame
from tuner.night.readback import ArmRecords, arms_of, campaign_folder, load_records, start_of
from tuner.night.state import replay_decisions
from tuner.night.schema import Journaled
from tuner.morning.report_model import (FAILURE_EXAMPLES, GROUPS, MEMORY_ROWS, ROWS_PER_GROUP, TELEMETRY_ARMS,  # noqa: F401
                           Section, _num, _pct, _span, _when, _words, missing)

MOVES, BASE, BETTER, UNDECIDED, PARITY, WORSE, FAILED = GROUPS
LEGEND_CHARS = 64            # a plot legend's entry: the arm and its value, cut where arms stay apart


@dataclass
class Report:
    folder: Path
    name: str
    objective: str
    frame: pd.DataFrame               # tuner.morning.export's flat columns + words, group, order
    sections: list[Section]
    plots: dict                       # inputs of tuner.morning.report_plots
    _pngs: dict | None = None

    def pngs(self) -> dict[str, bytes]:
        """name -> PNG bytes, drawn once per report."""
        if self._pngs is None:
            try:
                from tuner.morning.report_plots import draw_all
            except ImportError as e:           # matplotlib missing: the report still renders, and says so
                self._pngs = {}
                self.plot_note = (f"plots skipped: {(e.name or 'matplotlib').split('.')[0]} is not installed "
                                  "(pip install matplotlib, or reinstall offload-tuner)")
            else:
                self._pngs = draw_all(self.plots)
        return self._pngs

    plot_note: str | None = None
    no_result: bool = False           # the night learned nothing (campaign_end.no_result): the title says so


ArmView = ArmRecords           # an arm as the report reads it (tuner.night.readback)


class _Builder:
    def __init__(self, folder: Path, records: list[dict]):
        self.folder, self.records = folder, records
        self.start = start_of(records)
        camp = self.camp = Journaled(self.start.get("campaign"))
        self.name = camp.name or folder.name
        self.objective = camp.objective
        self.constraints = camp.constraints
        self.baseline = Shape.from_dict(self.start["baseline"])
        self.production = camp.has_production       # a production section: the baseline is its shape
        self.start_words = "the production shape" if self.production else "the campaign's baseline"
        arms = arms_of(records)
        self.arms = {a.n: a for a in arms}
        if not any(a.end is not None for a in self.arms.values()):
            raise ConfigError(f"{folder}: no finished arms yet, nothing to report "
                              "(the first arm is still running, or the campaign never started one)")
        # The incumbent, its re-measures and its moves come from tuner.night.state.replay, run once over
        # the records that decide them (campaign, incumbent moves, baseline and re-check arms): the
        # same State as over the whole journal, without a Shape for each of 10,000 probes.
        self.st = replay_decisions(records, self.baseline)
        self._shapes: dict[str, Shape] = {}
        self.df = arms_frame(records, arms).set_index("arm", drop=False).rename_axis(None)
        self.depths = [c[len("decode_"):] for c in self.df.columns if c.startswith("decode_")]
        self.moves = list(self.st.moves)
        self.inc_shape = {self.baseline.key(): self.baseline}
        self.inc_arm = {}                   # incumbent key -> the arm whose plan/score stands for it
        first_base = next((a.n for a in self.finished() if a.kind == "baseline"), None)
        self.inc_arm[self.baseline.key()] = first_base
        for m in self.moves:
            sh = Shape.from_dict(m["shape"])
            self.inc_shape[sh.key()] = sh
            self.inc_arm[sh.key()] = m["arm"]
        for a in self.arms.values():        # an arm begun ahead of a move: its change reads from the shape it supposed
            base = (a.start or {}).get("ahead")
            if base in self.arms and a.incumbent not in self.inc_shape:
                self.inc_shape[a.incumbent] = self.shape_of(base)
        self.move_of = {}                   # arm -> (move index, role)
        for i, m in enumerate(self.moves):
            self.move_of[m["arm"]] = (i, "confirm")      # the arm that decided the move
            for n in m.get("confirmed_arms") or ():       # the earlier boots of the same change
                if n != m["arm"]:
                    self.move_of.setdefault(n, (i, "probe"))
        self.names = ValueNames([a.change for a in self.arms.values() if a.change]
                                + [(lv, self.baseline.value_of(lv)) for lv in {a.change[0] for a in self.arms.values()
                                                                             if a.change}])
        self.confirm_of = {}                # probe arm -> its confirm arm
        last_probe = {}
        for a in self.arms.values():
            if a.change is None:
                continue
            key = (a.incumbent, a.change[0], values.text(a.change[1]))
            if a.kind == "probe":
                last_probe[key] = a.n
            elif a.kind == "confirm" and key in last_probe:
                self.confirm_of[last_probe[key]] = a.n

    def finished(self) -> list[ArmView]:
        return [a for a in self.arms.values() if a.end is not None]

    def shape_of(self, n: int) -> Shape:
        """The arm's Shape, built once per distinct shape."""
        raw = self.arms[n].start["shape"]
        key = json.dumps(raw, sort_keys=True)
        if key not in self._shapes:
            self._shapes[key] = Shape.from_dict(raw)
        return self._shapes[key]

    # -- per arm: words, group, order ----------------------------------------------------------
    def arm_words(self, a) -> str:
        if a.kind == "baseline":
            return f"#{a.n} baseline ({'production shape' if self.production else 'starting shape'})"
        if a.change is None:
            return f"#{a.n} {a.kind} of the incumbent" if a.kind != "recheck" else f"#{a.n} re-check of the incumbent"
        inc = self.inc_shape.get(a.incumbent)
        before = inc.value_of(a.change[0]) if inc is not None else ABSENT
        text = Change(a.change[0], before, a.change[1]).describe()
        return f"#{a.n} {'confirm: ' if a.kind == 'confirm' else ''}{text}"

    def legend(self, a) -> str:
        """The arm in a plot legend: its number and the value it changed, named apart from the
        lever's other values (tuner.morning.change_names)."""
        if a.kind == "baseline":
            return f"#{a.n} baseline"
        if a.change is None:
            return f"#{a.n} {'re-check' if a.kind == 'recheck' else a.kind}"
        return f"#{a.n} {'confirm ' if a.kind == 'confirm' else ''}{self.names.change(*a.change)}"

    def clock(self) -> tuple[bool, str]:
        """(whether the journal's times are simulated, how the report knows): ``simulated`` in
        campaign_start where the loop journaled it; else inferred from what the journal has."""
        if isinstance(self.start.get("simulated"), bool):
            return self.start["simulated"], "journaled in campaign_start"
        for a in self.finished():
            log = (((a.end or {}).get("probes") or {}).get("summary") or {}).get("kernel_log") or ""
            if "simulated host" in log:
                return True, f"inferred: arm #{a.n}'s host probes say “{log}”"
        engine = self.camp.engine
        t0 = float(self.records[0].get("t") or 0.0)
        if t0 and t0 % 900 == 0:             # SimHost's epoch; a real clock is never on the quarter hour to the ms
            return True, "inferred: the night starts on the quarter-hour to the millisecond, as a simulated host's clock does"
        if engine == "simengine":
            return False, "the simulated engine on a real host: real time, simulated numbers"
        return False, "a real host's clock"

    def verdict_words(self, a, row) -> tuple[str, str]:
        v = a.verdict or "running"
        band = "" if missing(row.threshold) else f"band ±{row.threshold:.1%}"
        d = _pct(row.delta)
        why = (a.end or {}).get("reason") or ""
        if missing(row.delta) and why.startswith(("constraint violation", "meets the constraints", "breaks a constraint")):
            d, band = why, "constraints first"          # a move decided by the constraint, not the objective
        if a.n in self.move_of:
            i, role = self.move_of[a.n]
            last = i == len(self.moves) - 1
            if role == "confirm":
                return MOVES, (f"**NEW INCUMBENT** — {d} vs the one it replaced" if last
                                   else f"incumbent move {i + 1} ({d}), superseded later")
            return MOVES, f"better {d} ({band}) — confirmed by #{self.moves[i]['arm']}"
        if v == "baseline":
            moved = bool(self.moves)
            return BASE, "old incumbent (start)" if moved else "incumbent (start) — held all night"
        if v == "recheck":
            return BASE, "re-check of the incumbent (feeds the noise band)"
        if v.startswith("boot-failed:"):
            return FAILED, f"boot failed: {v.split(':', 1)[1]}"
        if v == "corrupt":
            ev = (a.end.get("quality") or {}).get("evidence") or []
            return FAILED, "rejected — corrupts output" + (f" ({ev[0]})" if ev else "")
        if v in ("invalid", "interrupted"):
            return FAILED, f"{v} — {a.end.get('reason') or 'no reason recorded'}"
        if v == "better":
            c = self.confirm_of.get(a.n)
            cv = self.arms[c].verdict if c is not None else None
            tail = f"not confirmed by #{c} ({cv})" if cv else "confirmation pending"
            return BETTER, f"better {d} ({band}) — {tail}"
        if v == "parity":
            return PARITY, f"parity {d} ({band})" + (" — did not confirm" if a.kind == "confirm" else "")
        if v == "worse":
            return WORSE, (why or (f"{d} ({band}) — ruled out" if not missing(row.delta) else "worse — ruled out"))
        if v == "unstable":
            return UNDECIDED, f"unstable — {a.end.get('reason') or 'the rate never settled within the boot'}"
        if v == "undecided":
            c = (a.end or {}).get("compare") or {}
            interval = f" [{c['lo']:+.1%}, {c['hi']:+.1%}]" if c.get("lo") is not None else ""
            return UNDECIDED, f"undecided {d}{interval} — the interval straddles 0; more runs would settle it"
        return PARITY, v

    def annotate(self) -> pd.DataFrame:
        df = self.df
        words, verdicts, groups, legends = [], [], [], []
        for row in df.itertuples(index=False):
            a = self.arms[row.arm]
            words.append(self.arm_words(a))
            legends.append(self.legend(a))
            g, w = self.verdict_words(a, row) if a.end is not None else (None, "running")
            groups.append(g)
            verdicts.append(w)
        df = df.assign(words=words, verdict_words=verdicts, group=groups, legend=fit(legends, LEGEND_CHARS))
        gi = df["group"].map({g: i for i, g in enumerate(GROUPS)}).fillna(len(GROUPS))
        move_rank = pd.Series([-self.move_of[n][0] * 2 - (self.move_of[n][1] == "confirm") if n in self.move_of else 0
                               for n in df.index], index=df.index)
        obj = df["objective"].astype(float).fillna(float("-inf"))
        failed = gi == GROUPS.index(FAILED)
        key_obj = (-obj).where(~failed, df["arm"].astype(float))
        df = df.assign(_g=gi, _m=move_rank, _o=key_obj).sort_values(["_g", "_m", "_o", "arm"])
        return df.drop(columns=["_g", "_m", "_o"])

    # -- the incumbent over the night ----------------------------------------------------------
    def series(self) -> list[dict]:
        """Per finished arm in journal order: t, the incumbent value and the decision band the
        loop judged it against, as journaled in its ``arm_start`` (``State.judged``), then the
        final ones of ``campaign_end``. A journal from before they were journaled has none."""
        out = []
        marks = [(a.end, a.start.get("judged")) for a in self.arms.values() if a.end is not None]
        marks += [(e, e.get("judged")) for e in self.st.ends]
        for r, j in sorted(marks, key=lambda m: m[0].get("seq", 0)):         # in journal order
            if isinstance(j, dict) and j.get("incumbent_value") is not None:
                out.append({"t": r["t"], "arm": r.get("arm"), "incumbent": j["incumbent_value"], "band": j["band"]})
        return out


def build_report(folder: str | Path) -> Report:
    """The report of the campaign in ``folder`` (or the folder a campaign YAML file names)."""
    folder = campaign_folder(folder)
    b = _Builder(folder, load_records(folder))
    df = b.annotate()
    series = b.series()
    from tuner.morning.report_sections import sections

    secs = sections(b, df, series)
    t0 = b.records[0].get("t") or 0.0
    plots = {"depths": b.depths, "frame": df, "series": series, "t0": t0, "simulated": b.clock()[0],
             "incumbents": [b.inc_arm.get(b.baseline.key())] + [m["arm"] for m in b.moves],
             "objective": b.objective, "moves": [(m["t"], m["arm"]) for m in b.moves]}
    from tuner.morning.report_headline import no_result, start_objective

    return Report(folder=folder, name=b.name, objective=b.objective, frame=df, sections=secs, plots=plots,
                  no_result=no_result(b, start_objective(b, df)) is not None)


def render_markdown(report: Report) -> str:
    from tuner.morning.report_render import markdown

    return markdown(report)


def render_html(report: Report) -> str:
    from tuner.morning.report_render import html

    return html(report)


def write_report(folder: str | Path) -> str:
    """REPORT.md, report.html and report/*.png in the campaign folder; returns the Markdown."""
    report = build_report(folder)
    out = report.folder / "report"
    out.mkdir(exist_ok=True)
    for name, png in report.pngs().items():
        (out / f"{name}.png").write_bytes(png)
    md = render_markdown(report)
    (report.folder / "REPORT.md").write_text(md)
    (report.folder / "report.html").write_text(render_html(report))
    return md


__all__ = ["Report", "Section", "build_report", "render_html", "render_markdown", "write_report"]
