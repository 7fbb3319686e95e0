"""objective goodput_at_slo: every measured arm runs the concurrency sweep, and the campaign
promotes on goodput (the simulated engine in podman, wall-clock concurrency)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO, free_port


def _campaign(tmp_path, image: str) -> str:
    c = yaml.safe_load((REPO / "examples" / "goodput-campaign.yaml").read_text())
    c["name"], c["journal"] = "goodput-test", str(tmp_path / "journal")
    c["baseline"]["image"], c["baseline"]["port"] = image, free_port()
    c["levers"] = {"expert-prefetch": ["absent", 1]}
    c["measure"]["sweep"].update(levels=[1, 2], duration_s=1.5)
    c["budget"] = {"max_arms": 4}
    path = tmp_path / "goodput.yaml"
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return str(path)


@pytest.mark.podman
def test_goodput_campaign_promotes_on_goodput(tmp_path, sim_image):
    path = _campaign(tmp_path, sim_image.ref)
    r = subprocess.run([sys.executable, "-m", "tuner.cli", "run", path, "--quiet"], cwd=REPO, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "SWEEP done] goodput_at_slo" in r.stderr
    folder = tmp_path / "journal" / "goodput-test"
    recs = [json.loads(x) for x in (folder / "journal.jsonl").read_text().splitlines()]
    ends = {x["arm"]: x for x in recs if x["op"] == "arm_end"}
    measured = [e for e in ends.values() if (e.get("measurement") or {}).get("outcome") == "measured"]
    assert len(measured) >= 3
    for e in measured:                   # the objective is the sweep's goodput, not decode
        sw = e["measurement"]["sweep"]
        assert [lv["concurrency"] for lv in sw["levels"]] == [1, 2]
        assert e["score"]["objective"] == sw["goodput_at_slo"] and sw["goodput_at_slo"] > 0
    moves = [x for x in recs if x["op"] == "incumbent"]
    assert moves, "prefetch off decodes ~50 % faster: more requests meet the SLO, so it is promoted"
    assert dict(moves[-1]["shape"]["args"]).get("expert-prefetch") is None
    base = ends[0]["score"]["objective"]
    assert moves[-1]["score"]["objective"] > 1.2 * base
    d = json.loads(subprocess.run([sys.executable, "-m", "tuner.cli", "status", str(folder), "--json"], cwd=REPO,
                                  capture_output=True, text=True, timeout=60).stdout)
    assert d["objective"] == "goodput_at_slo" and d["gain"] > 0.2


def test_goodput_is_refused_in_simulated_time(tmp_path, capsys):
    from tuner.cli import main

    assert main(["run", _campaign(tmp_path, "localhost/offload-tuner-simengine:latest"), "--simulated"]) == 2
    assert "needs wall-clock concurrency: run it on podman" in capsys.readouterr().err


def test_sweep_settings_reach_the_plan(tmp_path):
    from tuner.night.campaign import load_campaign

    camp = load_campaign(_campaign(tmp_path, "localhost/offload-tuner-simengine:latest"))
    p = camp.sweep_plan
    assert p.levels == (1, 2) and p.duration_s == 1.5 and p.slo_tpot_s == 0.1 and p.output_tokens == 24
    assert str(camp.search.objective) == "goodput_at_slo"
