"""The night's log gives each arm one verdict, its final one: after the comparison that may
change it (a probe the runner judged better can be undecided once compared), with the
comparison's interval, and a pruned arm says it was pruned (issue 20)."""
from __future__ import annotations

import logging
import re

import yaml

from tests.report_journals import REPO, finished, records


def test_each_arm_logs_one_verdict_the_journaled_one_after_its_comparison(tmp_path, caplog):
    from tuner.cli import main

    camp = yaml.safe_load((REPO / "examples" / "sim-campaign.yaml").read_text())
    camp["baseline"]["compile_cache"] = str(tmp_path / "cc")
    camp["journal"] = str(tmp_path / "journal")
    camp["production"]["unit_file"] = str(tmp_path / "units" / "sim-demo.service")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(camp, sort_keys=False))
    with caplog.at_level(logging.INFO):
        assert main(["run", str(path), "--simulated", "--quiet"]) == 0
    lines = [r.getMessage() for r in caplog.records]
    recs = records(tmp_path / "journal" / "sim-demo")
    ends = finished(recs)
    compares = {r["arm"]: r["comparison"] for r in recs if r["op"] == "compare" and r.get("change")
                and r.get("kind") != "bracketed"}     # the arm's own comparison (a bracket re-judges it later)
    assert not [x for x in lines if " COMPARE " in x], "the comparison is part of the verdict line, not a second verdict"
    for n, end in ends.items():
        mine = [x for x in lines if x.startswith(f"[arm {n} VERDICT ")]
        assert len(mine) == 1, (n, mine)
        line = mine[0]
        assert line.startswith(f"[arm {n} VERDICT {end['verdict']}] "), (line, end["verdict"])
        start = next(i for i, x in enumerate(lines) if x.startswith(f"[arm {n} START "))
        assert lines.index(line) > start
        if n in compares:
            c = compares[n]
            assert f"{c['effect']:+.1%} [{c['lo']:+.1%}, {c['hi']:+.1%}] vs the incumbent" in line
            assert f"error rate {c['alpha']:.2g}" in line
        if str(end.get("reason", "")).startswith("pruned"):
            assert end["reason"] in line and "objective n/a" not in line
        if end["verdict"].startswith("boot-failed:"):
            assert end["boot"]["evidence"][0] in line
    assert any(e["verdict"] == "undecided" for e in ends.values()), "the night has an arm its comparison left undecided"
    assert any(str(e.get("reason", "")).startswith("pruned") for e in ends.values())
    assert all(re.match(r"\[arm \d+ VERDICT \S+\] ", x) for x in lines if " VERDICT " in x)
