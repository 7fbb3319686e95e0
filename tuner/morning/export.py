"""`tuner export`: one flat row per arm of a campaign, as CSV, JSON lines or Parquet.

The rows are built here from the journal alone (``arm_start`` + ``arm_end`` records, one pass)
and are also the table the morning report (``tuner.morning.report``) is made from, so the two never
disagree about an arm.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from arms.errors import ConfigError
from arms import values
from tuner.night.precheck import file_problem
from tuner.night.readback import ArmRecords, arms_of, campaign_folder, load_records

FORMATS = ("csv", "jsonl", "parquet")
# (column prefix, key of a depth's measurement)
DEPTH_FIELDS = (("decode", "median_decode_tok_s"), ("mad", "mad_decode_tok_s"), ("ttft", "median_ttft_s"))
COLUMNS = ("arm", "kind", "change_lever", "change_value", "verdict", "delta", "threshold", "objective",
           "feasible", "violation", "acceptance", "boot_outcome", "boot_s", "compile_s", "compile_cache_hit",
           "slots", "kv_pool_tokens", "max_concurrency", "max_concurrency_len", "graphs_gib", "graphs_count",
           "overhead_gib", "init_engine_s", "quality", "telemetry_status", "telemetry_precision", "measure_s",
           "arm_s", "t_start", "t_end", "incumbent", "reason", "evidence")
INT_COLUMNS = ("slots", "kv_pool_tokens", "max_concurrency_len", "graphs_count")
BOOL_COLUMNS = ("feasible", "compile_cache_hit")


def _precision(tel: dict | None):
    rep = (tel or {}).get("report") or {}
    return (rep.get("summary") or {}).get("precision")


def arm_row(start: dict, end: dict | None, depths: list[str]) -> dict:
    """One arm as flat columns (depth columns for every depth in ``depths``)."""
    end = end or {}
    ch = start.get("change")
    boot = end.get("boot") or {}
    rep = boot.get("report") or {}
    plan = rep.get("plan") or {}
    m = end.get("measurement") or {}
    md = m.get("depths") or {}
    score = end.get("score") or {}
    tel = end.get("telemetry")
    row = {
        "arm": start["arm"], "kind": start.get("kind"),
        "change_lever": ch[0] if ch else None, "change_value": values.text_of(ch[1]) if ch else None,
        "verdict": end.get("verdict"), "delta": end.get("delta"), "threshold": end.get("threshold"),
        "objective": score.get("objective"), "feasible": score.get("feasible"), "violation": score.get("violation"),
        "acceptance": m.get("acceptance"), "boot_outcome": boot.get("outcome"), "boot_s": boot.get("boot_s"),
        "compile_s": rep.get("compile_s"), "compile_cache_hit": rep.get("compile_cache_hit"),
        "slots": plan.get("slots"), "kv_pool_tokens": rep.get("kv_pool_tokens"),
        "max_concurrency": rep.get("max_concurrency"), "max_concurrency_len": rep.get("max_concurrency_len"),
        "graphs_gib": plan.get("graphs_gib"), "graphs_count": plan.get("graphs_count"),
        "overhead_gib": plan.get("overhead_gib"), "init_engine_s": rep.get("init_engine_s"),
        "quality": (end.get("quality") or {}).get("verdict"),
        "telemetry_status": (tel or {}).get("status"), "telemetry_precision": _precision(tel),
        "measure_s": end.get("measure_s"), "arm_s": end.get("arm_s"),
        "t_start": start.get("t"), "t_end": end.get("t"), "incumbent": start.get("incumbent"),
        "ahead": start.get("ahead"),
        "reason": end.get("reason"), "evidence": (boot.get("evidence") or [None])[0] if boot.get("outcome") != "ready" else None,
    }
    for d in depths:
        one = md.get(d) or {}
        for prefix, key in DEPTH_FIELDS:
            row[f"{prefix}_{d}"] = one.get(key)
    return row


def depths_of(arms: list[ArmRecords]) -> list[str]:
    seen: set[str] = set()
    for a in arms:
        if a.end is not None:
            seen.update(((a.end.get("measurement") or {}).get("depths") or {}).keys())
    return sorted(seen, key=lambda d: (0, int(d), d) if d.isdigit() else (1, 0, d))


def arms_frame(records: list[dict], arms: list[ArmRecords] | None = None) -> pd.DataFrame:
    """One row per arm (running arms included, verdict empty), columns in a fixed order."""
    arms = arms_of(records) if arms is None else arms
    depths = depths_of(arms)
    rows = [arm_row(a.start, a.end, depths) for a in arms]
    depth_cols = [f"{p}_{d}" for p, _ in DEPTH_FIELDS for d in depths]
    cols = list(COLUMNS[:11]) + depth_cols + list(COLUMNS[11:])
    df = pd.DataFrame(rows, columns=cols)
    for c in INT_COLUMNS:
        df[c] = pd.array(df[c].astype("float64").round(), dtype="Int64") if len(df) else df[c]
    for c in BOOL_COLUMNS:
        df[c] = df[c].astype("boolean")
    if not df["telemetry_precision"].notna().any():
        df = df.drop(columns=["telemetry_status", "telemetry_precision"])
    return df


def _plain(v):
    return v.item() if hasattr(v, "item") else str(v)


def export(folder: str | Path, fmt: str = "csv", out: str | Path | None = None) -> Path:
    """Write the campaign's arms as ``arms.<fmt>`` in its folder (or ``out``); returns the path."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: give one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401 - only whether it imports
        except ImportError:
            raise ConfigError("--format parquet needs pyarrow: pip install pyarrow "
                              "(or pip install 'offload-tuner[report]')") from None
    if out is not None:
        why = file_problem(out)              # before the journal is read: one line, exit 2
        if why:
            raise ConfigError(f"-o {out}: {why}; give a file in a folder this user can write")
    folder = campaign_folder(folder)
    df = arms_frame(load_records(folder))
    path = Path(out) if out else folder / f"arms.{fmt}"
    try:
        _write(df, path, fmt)
    except OSError as e:
        raise ConfigError(f"-o {path}: cannot write it ({e.strerror or e}); give a file in a folder this user "
                          "can write") from None
    return path


def _write(df: pd.DataFrame, path: Path, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "csv":
        df.to_csv(path, index=False)
    elif fmt == "jsonl":
        with open(path, "w") as f:                   # exact floats, null for a missing value
            for rec in df.astype(object).where(df.notna(), None).to_dict(orient="records"):
                f.write(json.dumps(rec, default=_plain, ensure_ascii=False) + "\n")
    else:
        df.to_parquet(path, index=False)
