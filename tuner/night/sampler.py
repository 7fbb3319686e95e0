"""The one-change policy as Optuna's sampler: the study *is* the search.

Each arm is one Optuna trial. ``OneChangeSampler`` samples the trial's one parameter, ``lever``
(the lever the arm changes, ``(incumbent)`` for a re-measure or the head-to-head), from the
policy's proposal (``tuner.night.search.propose`` over the replayed journal: sequential comparisons,
expected-gain order); ``before_trial`` writes why into the trial's user attrs (kind, value,
why), so optuna-dashboard shows what the search did and why.

What the study is told (``told_as``): the objective is named (``study.set_metric_names``);
the trial of the baseline and of every arm that moved the incumbent is COMPLETE with the
incumbent's chained value (the previous incumbent's value times 1 + the measured effect, whose
lower bound was above 0, so it only grows; a move the constraints decided adds 1e-6), so the
dashboard's "best trial" is the tuner's incumbent and never a lucky parity arm; every other
measured arm is PRUNED with its measured objective as its step-0 intermediate value; failures
are FAIL.
"""
from __future__ import annotations


import optuna
from optuna.samplers import BaseSampler
from optuna.trial import TrialState


from arms import values
from arms.verdict import untrusted
from tuner.night.proposal import Proposal


class OneChangeSampler(BaseSampler):
    def __init__(self) -> None:
        self._next: Proposal | None = None

    def propose(self, p: Proposal) -> None:
        """The policy's next arm; the next ``study.ask`` samples it."""
        self._next = p

    @staticmethod
    def attrs(p: Proposal) -> dict:
        return {"kind": p.kind, "value": values.param(*p.change) if p.change else p.kind, "why": p.why}

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def before_trial(self, study, trial) -> None:
        if self._next is not None:
            for k, v in self.attrs(self._next).items():
                study._storage.set_trial_user_attr(trial._trial_id, k, v)

    def sample_independent(self, study, trial, param_name, param_distribution):
        if param_name != "lever" or self._next is None:
            raise ValueError(f"OneChangeSampler samples only 'lever' after propose(); asked {param_name!r}")
        p = self._next
        return p.change[0] if p.change else "(incumbent)"


def told_as(end: dict, moved: dict | None, previous_value: float | None) -> tuple[TrialState, float | None]:
    """(state, value) to tell for an arm; ``moved``: the incumbent record it made, if any;
    ``previous_value``: the incumbent's chained value before it (None: this is the first)."""
    obj = (end.get("score") or {}).get("objective")
    if untrusted(end.get("verdict")) or obj is None:
        return TrialState.FAIL, None
    if previous_value is None and end.get("kind", "baseline") == "baseline":
        return TrialState.COMPLETE, obj
    if moved is not None and previous_value is not None:
        eff = (moved.get("comparison") or {}).get("effect")
        return TrialState.COMPLETE, previous_value * (1 + eff) if eff is not None else previous_value + 1e-6
    return TrialState.PRUNED, obj


def trial_of(study: optuna.Study, number: int):
    """Trial ``number`` of the study, None when it has none: the storage's own index (never the
    list of every trial, which grows with the night)."""
    try:
        return study._storage.get_trial(study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number))
    except KeyError:
        return None


def tell(study: optuna.Study, trial: int, state: TrialState, value: float | None) -> None:
    if state == TrialState.PRUNED and value is not None:
        t = trial_of(study, trial)
        study._storage.set_trial_intermediate_value(t._trial_id, 0, value)
    if state == TrialState.COMPLETE:
        study.tell(trial, value)
    else:
        study.tell(trial, state=state)
