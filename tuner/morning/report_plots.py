"""The report's three plots, drawn with matplotlib's Agg canvas (no pyplot, no display).

Each is a Figure ``WIDTH_IN`` x ``DPI`` = 1,650 px wide with no text under ``MIN_TEXT_PX`` (13 pt
labels, 12 pt ticks and legends at 100 dpi: 17-18 px), its legend outside the axes, each arm
named by its number and the value it changed, told apart from the lever's other values
(``legend`` of tuner.morning.report's frame). ``draw_all`` gives PNG bytes. They cap what they draw so a 10,000-arm night stays fast: decode
against depth draws the incumbents and the best ``TOP`` arms; the objective plot draws at most
``MAX_POINTS`` arms (evenly thinned beyond that); past ``MAX_TIMELINE`` arms the timeline
becomes the share of wall time per phase in time bins.
"""
from __future__ import annotations

import functools
import io

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 100
WIDTH_IN = 16.5                   # 1,650 px
MIN_TEXT_PX = 12
FONTS = {"font.size": 13, "axes.titlesize": 15, "axes.labelsize": 13, "xtick.labelsize": 12,
         "ytick.labelsize": 12, "legend.fontsize": 12, "legend.title_fontsize": 12}
TOP = 8
MAX_POINTS = 20000
MAX_TIMELINE = 300
COLORS = {"Incumbent moves": "#1b7837", "Baseline and re-checks": "#444444", "Better, not confirmed": "#5aae61",
          "Undecided — not settled": "#984ea3",
          "Parity — ruled out": "#4393c3", "Worse — ruled out": "#f4a582", "Failed": "#d6604d"}


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)          # no tight bbox: the width stays WIDTH_IN x DPI
    return buf.getvalue()


def _figure(height_in: float) -> Figure:
    return Figure(figsize=(WIDTH_IN, height_in), dpi=DPI, layout="constrained")


def _legend(fig: Figure, ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        fig.legend(*ax.get_legend_handles_labels(), loc="outside right upper", frameon=False)


def _fonts(draw):
    """Draw under ``FONTS`` (rcParams are read when an artist is made)."""
    @functools.wraps(draw)
    def inner(p: dict) -> Figure:
        with rc_context(FONTS):
            return draw(p)
    return inner


def _time_unit(p: dict, span: float) -> tuple[float, str]:
    scale, unit = (3600.0, "hours") if span > 3 * 3600 else (60.0, "minutes")
    return scale, f"{unit} since the campaign started" + (" (simulated time)" if p.get("simulated") else "")


@_fonts
def decode_vs_depth_figure(p: dict) -> Figure:
    df: pd.DataFrame = p["frame"]
    depths = p["depths"]
    fig = _figure(6.4)
    ax = fig.add_subplot()
    cols = [f"decode_{d}" for d in depths]
    if not depths:
        ax.text(0.5, 0.5, "no arm was measured", ha="center", va="center", transform=ax.transAxes)
        return fig
    x = np.array([int(d) for d in depths], dtype=float)
    measured = df[df[cols].notna().any(axis=1) & (df["group"] != "Failed")]
    inc = [n for n in p["incumbents"] if n is not None and n in measured.index]
    inc = inc[:1] + inc[1:][-3:]                 # the start incumbent and the last three moves
    others = measured[~measured["arm"].isin(inc)].sort_values("objective", ascending=False).head(TOP)
    for n in others["arm"]:
        r = measured.loc[n]
        ax.plot(x, r[cols].astype(float).to_numpy(), marker="o", lw=1.6, alpha=0.85, label=r["legend"])
    for i, n in enumerate(inc):
        r = measured.loc[n]
        final = i == len(inc) - 1
        ax.plot(x, r[cols].astype(float).to_numpy(), marker="s", lw=2.6 if final else 1.8, color="black" if final else "0.55",
                ls="-" if final else "--", label=("end incumbent: " if final else "incumbent: ") + r["legend"])
    if x.max() / max(x.min(), 1) > 4:
        ax.set_xscale("log")
    ax.set_xticks(x, [f"{int(v):,}" for v in x])
    ax.minorticks_off()
    ax.set_xlabel("prompt depth (tokens)")
    ax.set_ylabel("decode tok/s (median)")
    ax.set_title(f"Decode against depth: incumbents and the best {len(others)} arms")
    ax.grid(alpha=0.3)
    _legend(fig, ax)
    return fig


@_fonts
def objective_figure(p: dict) -> Figure:
    df: pd.DataFrame = p["frame"]
    t0 = p["t0"]
    fig = _figure(6.0)
    ax = fig.add_subplot()
    span = max((df["t_end"].max() or t0) - t0, 1.0)
    scale, xlabel = _time_unit(p, span)
    fin = df[df["t_end"].notna()]
    if len(fin) > MAX_POINTS:
        fin = fin.iloc[np.linspace(0, len(fin) - 1, MAX_POINTS).astype(int)]
    ok = fin[fin["objective"].notna()]
    for g, part in ok.groupby("group", sort=False):
        ax.scatter((part["t_end"] - t0) / scale, part["objective"], s=30 if len(ok) < 2000 else 4,
                   color=COLORS.get(g, "0.5"), label=g, zorder=3)
    ser = pd.DataFrame(p["series"])
    if not ser.empty:
        tx = (ser["t"] - t0) / scale
        ax.step(tx, ser["incumbent"], where="post", color="black", lw=1.6, zorder=5,
                label="incumbent (median of its measures)")
        ax.fill_between(tx, ser["incumbent"] * (1 - ser["band"]), ser["incumbent"] * (1 + ser["band"]),
                        step="post", color="0.4", alpha=0.3, zorder=4, label="decision band")
    bad = fin[fin["objective"].isna()]
    if len(bad):
        y0 = ok["objective"].min() if len(ok) else 0.0
        ax.scatter((bad["t_end"] - t0) / scale, np.full(len(bad), y0 * 0.95 if y0 else 0.0), marker="x",
                   s=36 if len(bad) < 2000 else 5, color=COLORS["Failed"], label="no objective (failed, pruned)", zorder=3)
    for t, n in p["moves"]:
        ax.axvline((t - t0) / scale, color="#1b7837", lw=0.8, ls=":")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(p["objective"])
    ax.set_title("Objective over the night")
    ax.grid(alpha=0.3)
    _legend(fig, ax)
    return fig


PHASES = (("boot", "#4393c3"), ("measure", "#1b7837"), ("failed boot", "#d6604d"), ("teardown, telemetry, other", "0.8"))


def _phases(df: pd.DataFrame, t0: float, scale: float):
    """Per arm: start and the end of each phase, in ``scale`` units since ``t0``."""
    start = (df["t_start"].to_numpy(float) - t0) / scale
    boot = start + df["boot_s"].fillna(0).to_numpy(float) / scale
    meas = boot + df["measure_s"].fillna(0).to_numpy(float) / scale
    end = (df["t_end"].to_numpy(float) - t0) / scale
    end = np.where(np.isnan(end), meas, end)          # a running arm: as far as it got
    boot, meas = np.minimum(boot, end), np.minimum(meas, end)   # phases stay inside the arm's wall span
    failed = (df["group"] == "Failed").to_numpy() & df["measure_s"].isna().to_numpy()
    return start, boot, meas, end, failed


@_fonts
def timeline_figure(p: dict) -> Figure:
    """One bar per arm (boot, measure, failure); past ``MAX_TIMELINE`` arms, where the night's
    time went per time bin, stacked by phase."""
    df = p["frame"].sort_values("arm")
    df = df[df["t_start"].notna()]
    t0, n = p["t0"], len(df)
    span = max(float(df["t_end"].max()) - t0, 1.0) if n and df["t_end"].notna().any() else 1.0
    scale, xlabel = _time_unit(p, span)
    unit = xlabel.split()[0]
    s, boot, meas, e, failed = _phases(df, t0, scale)
    if n > MAX_TIMELINE:
        fig = _figure(6.0)
        ax = fig.add_subplot()
        bins = 80
        width = span / scale / bins
        k = np.minimum((s / width).astype(int), bins - 1)
        parts = [np.where(failed, 0.0, boot - s), np.where(failed, 0.0, meas - boot), np.where(failed, e - s, 0.0),
                 np.where(failed, 0.0, e - meas)]
        bottom = np.zeros(bins)
        x = (np.arange(bins) + 0.5) * width
        for (label, color), w in zip(PHASES, parts):
            h = np.bincount(k, weights=w, minlength=bins) / width * 100
            ax.bar(x, h, width=width, bottom=bottom, color=color, label=label, linewidth=0)
            bottom += h
        ax.set_ylabel("share of wall time (%)")
        ax.set_title(f"Where the time of {n:,} arms went ({bins} bins of {width:.1f} {unit})")
    else:
        fig = _figure(min(9.0, 3.0 + 0.22 * n))
        ax = fig.add_subplot()
        y = df["arm"].to_numpy(float)
        lw = max(0.8, min(8.0, 300.0 / max(n, 1)))
        ok = ~failed
        ax.hlines(y[ok], s[ok], boot[ok], colors=PHASES[0][1], lw=lw, label=PHASES[0][0])
        ax.hlines(y[ok], boot[ok], meas[ok], colors=PHASES[1][1], lw=lw, label=PHASES[1][0])
        ax.hlines(y[failed], s[failed], e[failed], colors=PHASES[2][1], lw=lw, label=PHASES[2][0])
        ax.hlines(y[ok], meas[ok], e[ok], colors=PHASES[3][1], lw=lw, label=PHASES[3][0])
        ax.invert_yaxis()
        ax.set_ylabel("arm")
        ax.set_title(f"Timeline of {n:,} arms")
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3, axis="x")
    _legend(fig, ax)
    return fig


FIGURES = {"decode_vs_depth": decode_vs_depth_figure, "objective": objective_figure, "timeline": timeline_figure}


def draw_all(p: dict) -> dict[str, bytes]:
    return {name: _png(draw(p)) for name, draw in FIGURES.items()}
