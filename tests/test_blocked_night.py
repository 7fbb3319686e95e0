"""A simulated night on a drifting box (issue 19, Build 3): every promotion rests on blocks the
incumbent's boots bracket, the journal says which boots formed them, the search boots the
incumbent to close them, and the Optuna study still agrees with the journal."""
from __future__ import annotations

import pytest
import yaml

from simengine.landscape import DEFAULT_LANDSCAPE
from tests.test_campaign_sim import campaign, night
from tuner.night.state import replay
from tuner.night.study import _mismatch, open_study


def drifting(tmp_path, per_h: float):
    d = yaml.safe_load(DEFAULT_LANDSCAPE.read_text())
    d["drift_per_hour"] = per_h
    p = tmp_path / "drifting.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_a_drifting_night_promotes_only_on_closed_blocks_and_journals_them(tmp_path):
    path = campaign(tmp_path, "blocked")
    summary, recs, _ = night(path, seed=1, landscape=drifting(tmp_path, 0.03), max_arms=24)
    by_arm = {r["arm"]: r for r in recs if r["op"] == "arm_start"}
    moves = [r for r in recs if r["op"] == "incumbent"]
    assert moves, "the default landscape has clear winners within 24 arms"
    for m in moves:
        c = m["comparison"]
        assert c["open"] == 0 and c["boots"][0] >= 2 and c["verdict"] == "better"
        for b in c["blocks"]:
            assert b["closed"] and any(r < b["boot"] for r in b["ref"]) and any(r > b["boot"] for r in b["ref"])
            assert abs(sum(b["w"]) - 1) < 0.005          # the incumbent's line read at the boot's time
            assert all(by_arm[r]["identity"] == m["previous"] for r in b["ref"])
    bracketed = [r for r in recs if r["op"] == "compare" and r.get("kind") == "bracketed"]
    assert bracketed and all(by_arm[r["closed_by"]]["kind"] == "recheck" for r in bracketed)
    assert any(by_arm[r["closed_by"]]["why"].startswith("bracket arm") for r in bracketed)
    # a 'better' that waited for its bracket was never promoted before it
    for m in moves:
        first_better_closed = min(r["seq"] for r in recs if r["op"] == "compare" and r["arm"] == m["arm"]
                                  and r["comparison"]["verdict"] == "better" and r["comparison"].get("open") == 0)
        assert m["seq"] > first_better_closed
    seen = [r["comparison"].get("drift_seen") for r in bracketed if r["comparison"].get("drift_seen") is not None]
    assert seen and sum(seen) / len(seen) > 0.005       # the blocks saw the +3 %/h the box drifted


def test_every_look_tests_at_its_share_of_the_nights_rate_split_over_the_growing_boots_tests(tmp_path):
    """A look at a boot whose runs grow while it is undecided splits the look's error rate over
    the tests that may stop it (``EXTEND_CAP``); a bracketing look reads those runs and is split
    the same way (at its whole rate a noisy lever moved on a drifting box: realbox.md stop 40)."""
    from tuner.night.campaign import load_campaign
    from tuner.night.compare import look_alpha
    from tuner.night.judging import EXTEND_CAP, planned_looks

    path = campaign(tmp_path, "rates")
    _, recs, _ = night(path, seed=1, landscape=drifting(tmp_path, 0.03), max_arms=24)
    camp = load_campaign(path)
    planned = planned_looks(camp.levers)
    own = [r for r in recs if r["op"] == "compare" and r.get("change") and r.get("kind") is None]
    bracketed = [r for r in recs if r["op"] == "compare" and r.get("kind") == "bracketed"]
    assert own and bracketed
    for r in own + bracketed:
        assert r["comparison"]["alpha"] == pytest.approx(
            look_alpha(camp.search.error_rate, r["look"], planned, EXTEND_CAP), rel=1e-3)
    moved_by_bracket = [m for m in recs if m["op"] == "incumbent" and any(
        b["seq"] < m["seq"] and b["arm"] == m["arm"] for b in bracketed)]
    assert moved_by_bracket, "on a drifting box a move waits for the incumbent boot that closes its block"


def test_only_a_look_that_could_promote_spends_the_nights_rate(tmp_path):
    """A comparison whose boots are not all bracketed yet (or that rests on one boot) cannot move
    the incumbent: it spends nothing, and the look that can promote next runs at the same share.
    Each look that could promote has a number of its own, in journal order, so their shares still
    sum to at most the night's rate."""
    from tuner.night.verdict import can_promote

    path = campaign(tmp_path, "spend")
    _, recs, _ = night(path, seed=1, landscape=drifting(tmp_path, 0.03), max_arms=24)
    looks = [r for r in recs if r["op"] == "compare" and r.get("change")]
    spent = 0
    for r in looks:
        assert r["look"] == spent + 1, (r["arm"], r.get("kind"), r["look"], spent)
        spent += can_promote(r["comparison"])
    free = [r for r in looks if not can_promote(r["comparison"])]
    assert free and spent >= 2, "a drifting night has open comparisons and bracketed ones"
    numbers = [r["look"] for r in looks if can_promote(r["comparison"])]
    assert numbers == list(range(1, spent + 1))
    assert replay(recs, *_camp(path)).looks == spent


def test_a_test_on_closed_blocks_that_moves_nothing_is_a_look_spent_and_no_reading(tmp_path):
    """A shared campaign's test of a challenger on its closed blocks alone (``Judging._closed_move``)
    could promote: journaled whatever it reads, it spends a look; one that moved nothing is kept
    apart from the change's comparisons (the search, the report and the bracket read those)."""
    path = campaign(tmp_path, "closedtest")
    _, recs, _ = night(path, seed=1, landscape=drifting(tmp_path, 0.03), max_arms=24)
    base = replay(recs, *_camp(path))
    spent = next(r for r in recs if r["op"] == "compare" and r.get("change") and r["comparison"]["open"] == 0
                 and r["comparison"]["boots"][0] >= 2)
    failed = {**spent, "kind": "closed", "left_out": [spent["arm"]],
              "comparison": {**spent["comparison"], "verdict": "undecided"}}
    at = recs.index(spent) + 1
    st = replay(recs[:at] + [failed] + recs[at:], *_camp(path))
    assert st.looks == base.looks + 1
    assert st.closed_tests == [failed] and st.comparisons == base.comparisons
    assert st.latest_comparisons() == base.latest_comparisons()
    won = {**failed, "comparison": {**spent["comparison"], "verdict": "better"}}
    st = replay(recs[:at] + [won] + recs[at:], *_camp(path))
    assert st.looks == base.looks + 1 and not st.closed_tests and won in st.comparisons


def _camp(path):
    from tuner.night.campaign import load_campaign
    camp = load_campaign(path)
    return camp.baseline, camp.levers


def test_the_study_agrees_with_the_journal_after_bracketed_moves(tmp_path):
    """A move made at a recheck arm (its challenger's trial was kept RUNNING until then): the study's
    best trial is the arm of the last move, and a resume finds nothing to rebuild."""
    import optuna

    path = campaign(tmp_path, "agree")
    _, recs, host = night(path, seed=1, landscape=drifting(tmp_path, 0.03), max_arms=24)
    folder = tmp_path / "journal" / "agree"
    from tuner.night.campaign import load_campaign
    camp = load_campaign(path)
    st = replay(recs, camp.baseline, camp.levers)
    study = open_study(folder / "optuna.journal", camp.name, sampler=None, metric="decode_geomean")
    trials = study.get_trials(deepcopy=False)
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in trials)
    starts = {r["trial"]: r["arm"] for r in recs if r["op"] == "arm_start"}
    moves = [r for r in recs if r["op"] == "incumbent"]
    assert starts[study.best_trial.number] == moves[-1]["arm"]
    choices = ["(incumbent)"] + sorted(camp.levers)
    assert _mismatch(study, st, choices, camp.levers) is None
    told = [r["arm"] for r in recs if r["op"] == "told"]
    assert sorted(told) == sorted(set(told)) == sorted(r["arm"] for r in recs if r["op"] == "arm_start")



def test_a_trial_told_in_another_order_is_no_mismatch_a_wrong_value_is(tmp_path):
    """The boxes of a shared campaign tell in the order their arms end: the starting shape's first
    trial may be told PRUNED (another box's starting boot told COMPLETE first). Same objective: the
    study agrees (no rebuild under the other boxes' feet); another value, or a move told PRUNED: not."""
    import optuna
    from optuna.trial import TrialState, create_trial

    from tuner.night.campaign import load_campaign
    from tuner.night.study import _expected_all

    path = campaign(tmp_path, "order")
    _, recs, _ = night(path, seed=1, landscape=drifting(tmp_path, 0.03), max_arms=24)
    camp = load_campaign(path)
    st = replay(recs, camp.baseline, camp.levers)
    choices = ["(incumbent)"] + sorted(camp.levers)
    expected = _expected_all(st, choices, camp.levers)
    moved = {m["arm"] for m in st.moves}
    trial_of_arm = {a.n: a.trial for a in st.arms.values()}
    first_move = trial_of_arm[min(moved)]

    def study_with(trial: int, state, value):
        s = optuna.create_study(direction="maximize")
        for n in range(max(expected) + 1):
            want = dict(expected[n])
            if n == trial:
                want.update(state=state, value=value, intermediate_values={0: value} if state == TrialState.PRUNED else {})
            s.add_trial(create_trial(**want))
        return s

    base = expected[0]
    assert base["state"] == TrialState.COMPLETE
    assert _mismatch(study_with(0, TrialState.PRUNED, base["value"]), st, choices, camp.levers) is None
    assert "trial 0" in _mismatch(study_with(0, TrialState.PRUNED, base["value"] * 1.01), st, choices, camp.levers)
    m = expected[first_move]
    assert f"trial {first_move}" in _mismatch(study_with(first_move, TrialState.PRUNED, m["value"]), st, choices,
                                              camp.levers)

