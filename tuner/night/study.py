"""The Optuna study is derived state: it can always be rebuilt from the arm journal.

``open_study`` repairs a torn tail, and moves a file Optuna cannot load (a garbage line, a record
that is not Optuna's) aside to ``optuna.journal.damaged-N`` — nothing is deleted — before opening
a fresh one. ``sync_study`` compares the study with what the arm journal says each trial was and,
on any mismatch (a deleted or damaged file, a trial with the wrong lever or value), moves the file
aside the same way and rebuilds it: one trial per journaled arm, same number, params, user
attributes, state and value. Trials asked but never journaled as an arm are rebuilt as FAIL.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from arms import values
from arms.verdict import untrusted
from tuner.night.journal import repair_tail
from tuner.night.sampler import told_as
from tuner.night.state import State

from tuner.night.storage import is_url, open_storage  # noqa: F401 - where the study lives (is_url: for importers)

log = logging.getLogger("tuner.study")


def _loadable(path: Path) -> str | None:
    """Why Optuna could not replay this file (None when every complete line is one of its ops)."""
    if not path.exists():
        return None
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        try:
            rec = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            return f"line {n} is not JSON"
        if not isinstance(rec, dict) or "op_code" not in rec:
            return f"line {n} is not an Optuna journal operation"
    return None


def set_aside(path: Path, why: str) -> Path:
    """Rename a damaged study file to the first free ``<name>.damaged-N``; returns the new path."""
    n = 1
    while (dest := path.with_name(f"{path.name}.damaged-{n}")).exists():
        n += 1
    os.replace(path, dest)
    log.warning("[study] %s: %s; moved to %s, the study is rebuilt from the arm journal", path, why, dest.name)
    return dest


def _create(path: Path, name: str, sampler=None, metric: str | None = None, load: bool = True) -> optuna.Study:
    study = optuna.create_study(study_name=name, storage=open_storage(path), direction="maximize", load_if_exists=load,
                                sampler=sampler)
    if metric:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([metric])
    return study


def open_study(path, name: str, sampler=None, metric: str | None = None) -> optuna.Study:
    """The campaign's study (``sampler``: the search policy; ``metric``: the objective's name);
    ``path``: its journal file, or a shared campaign's database URL."""
    if is_url(path):
        return _create(path, name, sampler, metric)
    path = Path(path)
    repair_tail(path)
    why = _loadable(path)
    if why:
        set_aside(path, why)
    try:
        return _create(path, name, sampler, metric)
    except Exception as e:      # noqa: BLE001 - whatever Optuna makes of a damaged file, the journal rebuilds it
        set_aside(path, f"Optuna cannot load it ({type(e).__name__}: {e})")
        return _create(path, name, sampler, metric)


def _expected_all(st: State, choices: list[str], levers: dict) -> dict[int, dict]:
    """trial number -> the trial its arm's ask + tell left in the study, in trial order (the
    one-change study chains the incumbent's value from trial to trial: ``sampler.told_as``)."""
    moves = {m.get("arm"): m for m in st.moves}
    out, best = {}, None
    for a in sorted((a for a in st.arms.values() if a.trial is not None), key=lambda a: a.trial):
        want = _expected(a, choices, levers, moves.get(a.n), best)
        if want["state"] == TrialState.COMPLETE and want["value"] is not None and a.kind != "joint":
            best = want["value"] if best is None else max(best, want["value"])
        out[a.trial] = want
    return out


def _expected(arm, choices: list[str], levers: dict, moved: dict | None = None, best: float | None = None) -> dict:
    """The trial an arm's ask + tell left in the study."""
    end = arm.end or {}
    obj = (end.get("score") or {}).get("objective")
    ok = arm.end is not None and not untrusted(end.get("verdict")) and obj is not None
    inter = {}
    if arm.kind == "joint":
        params = (arm.start or {}).get("params") or {
            name: values.choice_of(name, lv.values, arm.shape.value_of(name)) for name, lv in levers.items()}
        dists = {name: CategoricalDistribution(values.choices(name, lv.values)) for name, lv in levers.items()}
        attrs = {}
    else:
        params = {"lever": arm.change[0] if arm.change else "(incumbent)"}
        dists = {"lever": CategoricalDistribution(choices)}
        attrs = {"value": values.param(*arm.change) if arm.change else arm.kind, "kind": arm.kind}
        if (arm.start or {}).get("why"):
            attrs["why"] = arm.start["why"]
        if arm.end is not None:                 # the one-change study: told as the sampler tells
            state, value = told_as({"kind": arm.kind, **end}, moved, best)
            if state == TrialState.PRUNED and value is not None:
                inter = {0: value}
            return {"params": params, "distributions": dists, "user_attrs": attrs, "state": state,
                    "value": value if state in (TrialState.COMPLETE, TrialState.PRUNED) else None,
                    "intermediate_values": inter}
    state = TrialState.COMPLETE if ok else (TrialState.FAIL if arm.end is not None else TrialState.RUNNING)
    return {"params": params, "distributions": dists, "user_attrs": attrs, "state": state,
            "value": obj if ok else None, "intermediate_values": inter}


def _mismatch(study: optuna.Study, st: State, choices: list[str], levers: dict) -> str | None:
    trials = study.get_trials(deepcopy=False)
    expected = _expected_all(st, choices, levers)
    moved = {m.get("arm") for m in st.moves}
    for a in sorted(st.arms.values(), key=lambda a: a.n):
        if a.trial is None:
            continue
        if a.trial >= len(trials):
            return f"arm {a.n}'s trial {a.trial} is missing ({len(trials)} trials)"
        t, want = trials[a.trial], expected[a.trial]
        if {k: t.params.get(k) for k in want["params"]} != want["params"]:
            return f"trial {a.trial} has params {t.params}, arm {a.n} journaled {want['params']}"
        if t.state == TrialState.RUNNING:
            continue                        # told by the reconcile that follows (a torn tell)
        if _told_in_another_order(a, t, want, moved):
            continue
        if t.state != want["state"] or (want["value"] is not None and t.value != want["value"]):
            return f"trial {a.trial} is {t.state.name} {t.value}, arm {a.n} journaled {want['state'].name} {want['value']}"
    return None


def _told_in_another_order(arm, t, want: dict, moved: set) -> bool:
    """A measured arm that moved nothing, told COMPLETE where the trial order says PRUNED (or the
    reverse) with its own objective: the boxes of a shared campaign tell in the order their arms end,
    and whether the first starting-shape trial told finds an earlier COMPLETE one depends on it."""
    either = {TrialState.COMPLETE, TrialState.PRUNED}
    if arm.n in moved or t.state not in either or want["state"] not in either:
        return False
    obj = ((arm.end or {}).get("score") or {}).get("objective")
    return obj is not None and t.value == obj


def rebuild(path: Path, name: str, st: State, choices: list[str], levers: dict, sampler=None,
            metric: str | None = None) -> optuna.Study:
    """A fresh study at ``path`` whose trials are the arm journal's, numbered as journaled."""
    study = _create(path, name, sampler, metric, load=False)
    by_trial = {a.trial: a for a in st.arms.values() if a.trial is not None}
    expected = _expected_all(st, choices, levers)
    for n in range(max(by_trial, default=-1) + 1):
        a = by_trial.get(n)
        if a is None:                        # asked, never journaled as an arm
            study.add_trial(create_trial(state=TrialState.FAIL, params={}, distributions={}))
            continue
        study.add_trial(create_trial(**expected[n]))
    log.warning("[study] %s rebuilt from the arm journal: %d trials", path, len(by_trial))
    return study


def sync_study(study: optuna.Study, path: Path, name: str, st: State, choices: list[str], levers: dict,
               sampler=None, metric: str | None = None) -> optuna.Study:
    """The study, or — when it disagrees with the arm journal — a rebuilt one (the old file set aside)."""
    why = _mismatch(study, st, choices, levers)
    if why is None:
        return study
    if is_url(path):                 # a shared study: rebuilt in place (the caller holds the campaign's lock)
        log.warning("[study] the shared study %s disagrees with the arm journal (%s): rebuilt", name, why)
        optuna.delete_study(study_name=name, storage=open_storage(path))
        return rebuild(path, name, st, choices, levers, sampler, metric)
    path = Path(path)
    if path.exists():
        set_aside(path, f"it disagrees with the arm journal ({why})")
    return rebuild(path, name, st, choices, levers, sampler, metric)


def fail_unclaimed(study: optuna.Study, st: State) -> list[int]:
    """Fail the trials no journaled arm claims that are still RUNNING or WAITING: a shared campaign's
    ask that the database cut between Optuna's own commits (a trial created, its param never set).
    Called under the campaign's lock, where no box is between its ask and its ``arm_start``."""
    claimed = {a.trial for a in st.arms.values() if a.trial is not None}
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
        if t.number in claimed:
            continue
        if t.state == TrialState.RUNNING:
            study.tell(t.number, state=TrialState.FAIL)
        else:                        # an enqueued trial never popped: Optuna's tell refuses WAITING ones
            study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        failed.append(t.number)
    if failed:
        log.warning("[study] trial(s) %s were asked in a transaction the database cut: failed", failed)
    return failed


def followed(study: optuna.Study, path, name: str, sampler=None, metric: str | None = None) -> optuna.Study:
    """A shared study as it is now: when another box rebuilt it (``sync_study``: deleted and made
    again under a new id), this box's handle is reopened by name instead of failing on the old id."""
    try:
        if study._storage.get_study_id_from_name(name) == study._study_id:
            return study
    except KeyError:
        pass
    log.warning("[study] the shared study %s was rebuilt by another box: reopened", name)
    return _create(path, name, sampler, metric)
