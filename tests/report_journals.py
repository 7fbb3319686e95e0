"""Campaign folders for the report and export tests, made by the campaign code itself.

``simulated_night`` runs ``tuner run --simulated`` (CampaignLoop + ArmRunner on SimHost: the
simulated engine booted in-process, in virtual time, no podman) on examples/sim-campaign.yaml
with telemetry on, three constraints and 56 arms: incumbent moves, parity, worse and pruned
arms, re-checks, every boot-failure class of the landscape, a corrupt arm, telemetry windows.
It runs once per test session (a few seconds); tests that change a journal copy the folder.
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
_made: dict[str, Path] = {}


def simulated_night(root: Path, arms: int = 56) -> Path:
    key = f"{root}:{arms}"
    if key in _made:
        return _made[key]
    from tuner.cli import main

    camp = yaml.safe_load((REPO / "examples" / "sim-campaign.yaml").read_text())
    camp["name"] = "report-night"
    camp["baseline"]["compile_cache"] = str(root / "compile-cache")
    camp["journal"] = str(root / "journal")
    camp["measure"]["telemetry"] = True
    camp["constraints"] = {"max_concurrency_at": {"tokens": 32768, "min": 2.0}, "boot_seconds_max": 600,
                           "min_slots": 6600}
    camp["budget"] = {"max_arms": arms}
    path = root / "campaign.yaml"
    path.write_text(yaml.safe_dump(camp, sort_keys=False))
    assert main(["run", str(path), "--simulated", "--quiet"]) == 0
    _made[key] = root / "journal" / "report-night"
    return _made[key]


def records(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (Path(folder) / "journal.jsonl").read_text().splitlines() if x.strip()]


def write_journal(folder: Path, recs: list[dict], tail: bytes = b"") -> Path:
    """Records as the Journal writes them (one compact JSON object a line), plus raw ``tail``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "journal.jsonl"
    path.write_bytes(b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in recs) + tail)
    return path


def finished(recs: list[dict]) -> dict[int, dict]:
    """arm -> its first arm_end (as replay keeps it)."""
    out: dict[int, dict] = {}
    for r in recs:
        if r["op"] == "arm_end" and r["arm"] not in out:
            out[r["arm"]] = r
    return out


def starts(recs: list[dict]) -> dict[int, dict]:
    return {r["arm"]: r for r in recs if r["op"] == "arm_start"}


def load_bench():
    """bench/report_scale.py as a module (its synthetic journal generator)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("report_scale", REPO / "bench" / "report_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
