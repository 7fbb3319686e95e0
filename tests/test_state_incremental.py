"""The replayed State keeps indexes as arms end (the noise band's pooled variance, the probes by
change and by incumbent, the measurements by shape, the arms since the last re-measure, the
promotion looks), so the loop's per-arm bookkeeping does not grow with the night
(bench/replay_scale.py). After every arm of a simulated night, and after every record of a
replay whose arms end out of order or start twice, they equal the pass over every arm that
``State`` used to make (``tuner.night.state.from_scratch``)."""
from __future__ import annotations

import json

from arms.profiles import load_profile
from host.simhost import SimHost
from tests.test_campaign_sim import campaign
from tuner.night.campaign import load_campaign
from tuner.night.loop import CampaignLoop
from tuner.night.state import Replay, from_scratch, incremental


def agree(st) -> None:
    want, got = from_scratch(st), incremental(st)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == want[k], k
    assert st.judged(0.02)["noise_band"] == want["band"].relative


def night(tmp_path, name, arms):
    camp, host = SimHost.pinned(load_campaign(campaign(tmp_path, name)), noise_seed=3)
    seen = []

    def on_arm(st, end):
        agree(st)
        seen.append(len(st.finished()))
    CampaignLoop(camp, host, load_profile("simengine"), max_arms=arms, on_arm=on_arm).run()
    recs = [json.loads(x) for x in (camp.folder / "journal.jsonl").read_text().splitlines()]
    return camp, recs, seen


def test_the_indexes_equal_a_pass_over_every_arm_after_every_arm_of_a_night(tmp_path):
    camp, recs, seen = night(tmp_path, "incr", 24)
    assert seen == list(range(1, 25))                      # checked after every arm
    ops = {r["op"] for r in recs}
    assert {"incumbent", "compare"} <= ops                # the night moved and compared: the indexes were used
    st = Replay(camp.baseline, camp.levers).update(recs)  # a whole replay keeps them too
    agree(st)
    assert st.looks > 0 and st.band.pooled_arms > 10 and st.history()


def test_out_of_order_ends_and_a_restarted_arm_still_agree(tmp_path):
    camp, recs, _ = night(tmp_path, "disorder", 12)
    ends = [i for i, r in enumerate(recs) if r["op"] == "arm_end"]
    late = recs.pop(ends[3])                               # arm 3 ends after every other arm
    recs.insert(len(recs) - 1, late)
    restart = next(r for r in recs if r["op"] == "arm_start" and r["arm"] == 5)
    recs.append({**restart, "seq": recs[-1]["seq"] + 1})   # arm 5 starts again (a damaged journal)
    rp = Replay(camp.baseline, camp.levers)
    for i in range(1, len(recs) + 1):
        agree(rp.update(recs[:i]))
    assert 5 not in [a.n for a in rp.state.finished()]
