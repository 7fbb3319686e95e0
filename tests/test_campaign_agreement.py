"""A whole campaign in virtual time (`tuner run --simulated`, SimHost) agrees with the same campaign
on the real podman host: same arms (kind, change) in the same order, same verdict per arm, same
incumbent moves, same final incumbent shape and the same end; objectives equal within 5 % (podman
measures real wall-clock decode). The landscape is the fast default one with noise 0 and a fixed
noise seed (spec acceptance draws), and every lever's effect is far from the 2 % band."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import free_port
from tests.test_campaign_podman import BASE_ENV, campaign, records, tuner

pytestmark = pytest.mark.podman

ENV = {**BASE_ENV, "SIMENGINE_NOISE_SEED": 7, "R4D_LRU_UVA_TOKENS": 2048}     # 2048: x0.61 decode
LEVERS = {
    "expert-prefetch": ["absent", 1],                                          # off: +50 %, better
    "max-num-seqs": [2, 4],                                                    # 2: constraint violation
    "gpu-memory-utilization": [0.98, 0.99],                                    # 0.99: not enough memory
    "env.CLAV_TUNABLEOP_WITH_OFFLOAD": {"values": ["absent", 1], "numerics": "changing"},   # corrupt
    "speculative-config": [{"method": "mtp", "num_speculative_tokens": 4},
                           {"method": "mtp", "num_speculative_tokens": 6}],    # 6: -29 %, worse
    "env.R4D_LRU_UVA_TOKENS": [2048, "absent"],                                # absent: +64 %, better
}


def night(tmp_path, sim_image, port: int, simulated: bool):
    """Run the campaign on one host in its own folder; returns (records, folder)."""
    folder = tmp_path / ("sim" if simulated else "podman")
    folder.mkdir()
    path = campaign(folder, sim_image, "agree", levers=LEVERS, budget={"max_arms": 16})
    data = yaml.safe_load(Path(path).read_text())
    data["baseline"].update(env=ENV, port=port)
    # no probe is pruned after its first depth: mtp 6 reads -29 %, and the default prune line (-30 %)
    # would part the hosts on a machine loaded enough to slow podman's wall-clock decode by 1 %
    data["noise"] = {**(data.get("noise") or {}), "prune_below": 0.5}
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))
    r = tuner("run", path, "--quiet", *(["--simulated"] if simulated else []))
    assert r.returncode == 0, r.stderr[-3000:]
    return records(folder, "agree"), folder


def outline(recs, folder):
    """What must agree: arms, verdicts, objectives, moves (shapes without image and folder), end."""
    def shape(s):
        return json.loads(json.dumps({k: v for k, v in s.items() if k != "image"}).replace(str(folder), "F"))

    ends = {x["arm"]: x for x in recs if x["op"] == "arm_end"}
    arms = [(x["arm"], x["kind"], x["change"], ends[x["arm"]]["verdict"]) for x in recs if x["op"] == "arm_start"]
    objs = [(ends[a[0]].get("score") or {}).get("objective") for a in arms]
    moves = [(x["arm"], x["change"], shape(x["shape"])) for x in recs if x["op"] == "incumbent"]
    move_objs = [x["score"]["objective"] for x in recs if x["op"] == "incumbent"]
    end = [x for x in recs if x["op"] == "campaign_end"]
    return arms, objs, moves, move_objs, end[-1]["reason"] if end else None


def test_simulated_campaign_agrees_with_the_podman_campaign(tmp_path, sim_image, podman_host):
    port = free_port()
    sim_recs, sim_dir = night(tmp_path, sim_image, port, simulated=True)
    pod_recs, pod_dir = night(tmp_path, sim_image, port, simulated=False)
    s_arms, s_objs, s_moves, s_mobjs, s_end = outline(sim_recs, sim_dir)
    p_arms, p_objs, p_moves, p_mobjs, p_end = outline(pod_recs, pod_dir)
    # the landscape is really exercised: both kinds of boot failure, corrupt, worse, two moves
    verdicts = {a[3] for a in s_arms}
    assert {"better", "worse", "corrupt", "boot-failed:constraint-violation",
            "boot-failed:insufficient-memory-for-utilization"} <= verdicts, s_arms
    # the night is spent: it ends when every challenger is decided or its budget is used up
    assert len(s_moves) == 2 and (s_end.startswith("converged") or "budget" in s_end), (s_moves, s_end)
    # agreement, arm by arm
    assert [a[:3] for a in p_arms] == [a[:3] for a in s_arms]       # the same arms in the same order
    assert p_arms == s_arms                                          # ... with the same verdicts
    for arm, s, p in zip(s_arms, s_objs, p_objs):
        assert (s is None) == (p is None), arm
        assert s is None or p == pytest.approx(s, rel=0.05), (arm, s, p)
    assert p_moves == s_moves                                        # same moves, same shapes
    assert p_mobjs == pytest.approx(s_mobjs, rel=0.05)
    final = dict(s_moves[-1][2]["args"]), s_moves[-1][2]["env"]
    assert "expert-prefetch" not in final[0] and "R4D_LRU_UVA_TOKENS" not in final[1]
    assert p_end == s_end
