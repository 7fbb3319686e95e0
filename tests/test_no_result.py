"""A night that learned nothing says so, and a simulated night is never promoted unasked."""
from __future__ import annotations

import shutil

from arms.shape import Shape
from tests.conftest import REPO
from tests.test_campaign_sim import campaign
from tests.test_night_budget import records, tuner
from tuner.night.ending import NO_RESULT_EXIT, no_result
from tuner.night.state import replay


def test_a_night_whose_baseline_never_boots_stops_says_no_result_and_exits_4(tmp_path):
    """examples/llamacpp-cpu.yaml on the simulated engine: every boot refuses llama-server's
    flags. The night stops after the baseline and its re-check instead of trying 16 arms."""
    (tmp_path / "examples").mkdir()
    path = tmp_path / "examples" / "llamacpp-cpu.yaml"           # its journal: ../journal, as in the repo
    shutil.copy(REPO / "examples" / "llamacpp-cpu.yaml", path)
    r = tuner("run", path, "--simulated", "--quiet")
    assert r.returncode == NO_RESULT_EXIT == 3, r.stderr[-2000:]
    first = r.stdout.splitlines()[0]
    assert first.startswith("no result: the starting shape did not boot (2 of 2 boots failed"), r.stdout
    assert "evidence: vllm: error: unrecognized arguments" in first          # the engine's own line
    folder = tmp_path / "journal" / "llamacpp-cpu"
    recs = records(folder)
    assert [r["kind"] for r in recs if r["op"] == "arm_start"] == ["baseline", "recheck"]
    end = recs[-1]
    assert end["op"] == "campaign_end" and end["reason"].startswith("no result: ")
    assert end["no_result"]["evidence"].startswith("vllm: error: unrecognized arguments")
    from tuner.morning.report import build_report

    from tuner.morning.status import status_data, summary_line

    import yaml

    cap = yaml.safe_load(path.read_text())["budget"]["max_arms"]             # the example's own cap
    assert summary_line(status_data(folder)).startswith(f"llamacpp-cpu: ended, no result; 2/{cap} arms")
    kind, text = build_report(folder).sections[0].blocks[0]
    assert kind == "p" and text.startswith("**No result:** the starting shape did not boot")
    # run again: the same file would learn nothing again; nothing is written, same code
    data = (folder / "journal.jsonl").read_bytes()
    again = tuner("run", path, "--simulated", "--quiet")
    assert again.returncode == 3 and again.stdout.splitlines()[0] == first
    assert (folder / "journal.jsonl").read_bytes() == data


def _night(ends: list[dict], kinds=("baseline", "recheck")) -> list[dict]:
    base = Shape.from_mapping({"image": "img@sha256:" + "0" * 64, "model": "/m", "args": {"a": 1}})
    recs = [{"op": "campaign_start", "seq": 0, "t": 0.0, "baseline": base.to_dict()}]
    for n, (kind, end) in enumerate(zip(kinds, ends)):
        recs.append({"op": "arm_start", "seq": len(recs), "t": 1.0, "arm": n, "kind": kind, "shape": base.to_dict(),
                     "incumbent": base.key(), "trial": n})
        recs.append({"op": "arm_end", "seq": len(recs), "t": 2.0, "arm": n, "kind": kind, **end})
    return replay(recs, base)


MEASURED_NA = {"verdict": "baseline", "score": {"feasible": True, "violation": 0, "objective": None},
               "reason": "objective n/a: depth 4064 was not measured"}
MEASURED = {"verdict": "baseline", "score": {"feasible": True, "violation": 0, "objective": 26.8}}
FAILED = {"verdict": "boot-failed:bad-argument", "boot": {"evidence": ["error: unrecognized arguments: --x"]}}


def test_the_no_result_rule_the_starting_shapes_first_boots():
    ask = dict(boots=2, objective="decode@4064", constraints=False)
    nr = no_result(_night([MEASURED_NA, MEASURED_NA]), **ask)
    assert nr.cause.startswith("the starting shape booted but never yielded the objective decode@4064 (2 boots)")
    assert nr.evidence == "objective n/a: depth 4064 was not measured"
    nr = no_result(_night([FAILED, FAILED]), **ask)
    assert "2 of 2 boots failed: bad-argument" in nr.cause and nr.evidence == "error: unrecognized arguments: --x"
    assert "no trusted measurement" in no_result(_night([FAILED, MEASURED_NA]), **ask).cause
    assert no_result(_night([FAILED]), **ask) is None                         # its re-check still to come
    assert no_result(_night([FAILED]), **{**ask, "boots": 1}) is not None     # re-checks off: one boot decides
    assert no_result(_night([FAILED, MEASURED]), **ask) is None                # the re-check measured: a result
    assert no_result(_night([MEASURED, FAILED]), **ask) is None
    assert no_result(_night([MEASURED_NA, MEASURED_NA]), **{**ask, "constraints": True}) is None   # ranked by them
    assert no_result(_night([{"verdict": "interrupted"}, FAILED]), **ask) is None   # a crash is no boot


def test_a_simulated_night_is_refused_by_promote_in_one_line_unless_allowed(tmp_path):
    from tests.test_promote import UNIT, ProdFake, production, smoke_at
    from tuner.production.promote import promote

    path = campaign(tmp_path, "simprom", budget={"max_arms": 8}, production=production(tmp_path, "quadlet"))
    r = tuner("run", path, "--simulated", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    folder = tmp_path / "journal" / "simprom"
    assert records(folder)[0]["simulated"] is True
    assert any(x["op"] == "incumbent" for x in records(folder))         # a confirmed winner to promote
    refused = tuner("promote", folder)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "was a simulated night (`tuner run --simulated`)" in lines[0] and "--allow-simulated" in lines[0]
    assert not any(x["op"] == "promotion" for x in records(folder))      # nothing written
    target = tmp_path / "quadlet" / UNIT.replace(".service", ".container")
    out = []
    res = promote(folder, host=ProdFake(target, "quadlet"), smoke=smoke_at(60.0), poll_s=0.5, out=out.append,
                  allow_simulated=True)
    assert res.outcome == "promoted", out
    assert out[0].startswith("warning: campaign simprom was a simulated night")

