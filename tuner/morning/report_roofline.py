"""The roofline section of the morning report for llama.cpp campaigns: how far the incumbent's
decode is from what host memory bandwidth allows (arms.headroom.Roofline).

Bytes per token come from the baseline's GGUF (active experts + attention + output, read every
token); the bandwidth from the campaign (``measure.membw_gbs``) or, when it gives none, from
host.membw's probe, run once and kept in the campaign folder (``membw.json``) so the report
renders the same figure every time.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from arms.headroom import Roofline, bytes_per_token
from arms.profiles import load_profile

from tuner.morning.report_model import Section, missing
from tuner.night.schema import Journaled

log = logging.getLogger("tuner.report")


def _bandwidth(folder: Path, camp: dict, start: dict | None = None) -> tuple[float | None, str]:
    """The host memory bandwidth the roofline divides by, and where it came from: the campaign's
    measure.membw_gbs, else what the night measured at its start (campaign_start ``membw``), else
    the membw.json an older tuner's report left in the folder. A reader never probes or writes."""
    given = Journaled(camp).measure.membw_gbs
    if given:
        return float(given), "campaign measure.membw_gbs"
    journaled = (start or {}).get("membw")
    if isinstance(journaled, dict) and journaled.get("gbs"):
        return float(journaled["gbs"]), str(journaled.get("source") or "measured at the start of the night")
    cache = folder / "membw.json"
    if cache.exists():
        d = json.loads(cache.read_text())
        return d["gbs"], d["source"]
    return None, "not measured (a night from before the tuner journaled it, or measure.membw_gbs not set)"


def roofline(b, df) -> Section | None:
    try:
        family = load_profile(b.camp.engine).family
    except Exception:       # noqa: BLE001 - a profile the report cannot load: no roofline
        return None
    if family != "llamacpp":
        return None
    s = Section("Roofline")
    model = Path(b.baseline.model)
    if not model.is_file():
        return s.add("p", f"The model {model} is not on this host: bytes per token n/a.")
    try:
        from host.membw import gguf_tensors

        tensors, n_expert, n_used = gguf_tensors(model)
    except ImportError:
        return s.add("p", "Bytes per token need the `gguf` package (pip install gguf) to read the model.")
    except (OSError, ValueError) as e:
        return s.add("p", f"The model {model} could not be read as GGUF ({e}): bytes per token n/a.")
    per_token = bytes_per_token(tensors, n_expert, n_used)
    gbs, source = _bandwidth(Path(b.folder), b.camp.raw, b.start)
    inc_n = b.inc_arm.get(b.st.incumbent.key())
    if inc_n is None or inc_n not in df.index:
        return s.add("p", "No measured incumbent: decode n/a.")
    row = df.loc[inc_n]
    for d in b.depths:
        v = row.get(f"decode_{d}")
        if missing(v):
            continue
        r = Roofline(per_token, float(v), gbs, source)
        s.add("p", f"At depth {d} (incumbent, arm #{inc_n}): " + "; ".join(r.findings()) + ".")
    s.add("p", f"{n_used} of {n_expert} experts are active per token. Threads, batch sizes and flash attention move "
               "decode toward this line; nothing moves it past it but fewer bytes per token (a smaller quant, "
               "fewer active experts) or more bandwidth.")
    return s
