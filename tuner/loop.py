"""The campaign loop: resume, reconcile, then propose → arm → journal → tell until the budget
ends. The arm journal is the source of truth; the Optuna study (JournalFileBackend in the
campaign folder) is reconciled to it at every start, so the two never disagree after a crash.
"""
from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from arms.errors import ConfigError
from arms.host import Host
from arms.lifecycle import crashpoint, sweep_orphans
from arms.profiles import EngineProfile

from .arm_runner import ArmRunner
from .guard import Guard
from .journal import Journal, decode_value, repair_tail
from .search import Proposal, apply, encode_value, propose
from .state import State, replay
from .verdict import Score

log = logging.getLogger("tuner.loop")
optuna.logging.set_verbosity(optuna.logging.WARNING)


def campaign_hash(camp) -> str:
    blob = json.dumps(camp.raw, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def open_study(path: Path, name: str) -> optuna.Study:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    repair_tail(path)
    storage = JournalStorage(JournalFileBackend(str(path)))
    return optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)


@dataclass
class Summary:
    reason: str
    arms: int
    incumbent_key: str
    incumbent_objective: float | None
    moves: int
    verdict: str | None = None      # "no shape satisfies …" when the constraints were never met


class CampaignLoop:
    def __init__(self, camp, host: Host, profile: EngineProfile, *, deadline: float | None = None,
                 max_arms: int | None = None, force_resume: bool = False, stop: Callable[[], bool] | None = None,
                 on_arm: Callable[[State, dict], None] | None = None):
        self.camp, self.host, self.profile = camp, host, profile
        self.deadline, self.max_arms, self.force = deadline, max_arms, force_resume
        self.stop = stop or (lambda: False)
        self.on_arm = on_arm
        folder = camp.folder
        folder.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(folder / "journal.jsonl")
        self.study = open_study(folder / "optuna.journal", camp.name)
        self.runner = ArmRunner.for_campaign(camp, host, profile)
        self.choices = ["(incumbent)"] + sorted(camp.levers)

    # -- start: identity, reconcile ----------------------------------------------------------
    def _start(self) -> State:
        h = campaign_hash(self.camp)
        started = next((r for r in self.journal.records if r["op"] == "campaign_start"), None)
        if started and started.get("campaign_hash") != h and not self.force:
            old = started.get("campaign", {})
            diff = sorted(k for k in set(old) | set(self.camp.raw) if old.get(k) != self.camp.raw.get(k))
            raise ConfigError(f"{self.camp.folder} was written by a different campaign file (keys that differ: "
                              f"{', '.join(diff) or 'none at top level'}); pass --force-resume to continue it anyway")
        if not started:
            self.journal.append("campaign_start", campaign_hash=h, campaign=json.loads(json.dumps(self.camp.raw, default=str)),
                                file=str(self.camp.path), baseline=self.camp.baseline.to_dict())
        else:
            self.journal.append("note", text="resumed", campaign_hash=h)
        removed = sweep_orphans(self.host, self.camp.name)
        st = replay(self.journal.records, self.camp.baseline)
        for a in st.open_arms:        # the tuner died inside this arm
            self.journal.append("arm_end", arm=a.n, kind=a.kind, verdict="interrupted",
                                reason="the tuner stopped mid-arm; its container was removed on resume",
                                orphans_removed=len(removed))
            log.warning("[arm %s VERDICT interrupted] resumed after a crash", a.n)
        st = replay(self.journal.records, self.camp.baseline)
        for a in st.finished():       # a confirmed win whose promotion the crash cut off
            if a.kind == "confirm" and a.verdict == "better" and a.incumbent == st.incumbent.key():
                self._promote(st, a.n)
                st = replay(self.journal.records, self.camp.baseline)
        self._reconcile_optuna(st)
        return replay(self.journal.records, self.camp.baseline)

    def _reconcile_optuna(self, st: State) -> None:
        by_trial = {a.trial: a for a in st.arms.values() if a.trial is not None}
        for t in self.study.get_trials(deepcopy=False):
            if t.state != TrialState.RUNNING:
                continue
            a = by_trial.get(t.number)
            if a is None or a.end is None:
                self.study.tell(t.number, state=TrialState.FAIL)       # asked, never became an arm
        for a in st.arms.values():
            if a.end is not None and not a.told and a.trial is not None:
                self._tell(a.trial, a.end)
                self.journal.append("told", arm=a.n, trial=a.trial)

    def _tell(self, trial: int, end: dict) -> None:
        t = self.study.get_trials(deepcopy=False)[trial] if trial < len(self.study.get_trials(deepcopy=False)) else None
        if t is None or t.state != TrialState.RUNNING:
            return
        obj = (end.get("score") or {}).get("objective")
        ok = end.get("verdict") not in ("interrupted", "invalid", "corrupt") and not str(end.get("verdict", "")).startswith("boot-failed")
        if ok and obj is not None:
            self.study.tell(trial, obj)
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    # -- the loop -------------------------------------------------------------------------------
    def _ask(self, p: Proposal) -> int:
        lever = p.change[0] if p.change else "(incumbent)"
        value = json.dumps(encode_value(p.change[1]), sort_keys=True) if p.change else p.kind
        self.study.enqueue_trial({"lever": lever}, user_attrs={"value": value, "kind": p.kind})
        trial = self.study.ask({"lever": CategoricalDistribution(self.choices)})
        return trial.number

    def run(self) -> Summary:
        st = self._start()
        guard = Guard(self.camp.production, self.host, self.journal)
        guard.enter()
        try:
            return self._loop(st)
        finally:
            guard.exit()

    def _loop(self, st: State) -> Summary:
        arms_run = 0
        reason = "converged: no one-change neighbour left to try"
        while True:
            if self.stop():
                reason = "stopped"
                break
            if self.deadline is not None and self.host.now() >= self.deadline:
                reason = "deadline reached"
                break
            if self.max_arms is not None and len(st.arms) >= self.max_arms:
                reason = f"arm budget of {self.max_arms} reached"
                break
            if self.camp.search.mode == "joint":
                p = self._joint_proposal(st)
            else:
                p = propose(st, self.camp.levers, recheck_every=self.camp.search.recheck_every,
                            confirm=self.camp.search.confirm)
            if p is None:
                break
            self._run_one(st, p)
            arms_run += 1
            st = replay(self.journal.records, self.camp.baseline)
            if self.on_arm:
                self.on_arm(st, st.arms[max(st.arms)].end or {})
        verdict = self._verdict(st)
        self.journal.append("campaign_end", reason=reason, arms=len(st.arms),
                            incumbent=st.incumbent.to_dict() if st.incumbent else None, verdict=verdict)
        log.info("[campaign END] %s after %d arms%s", reason, len(st.arms), f" — {verdict}" if verdict else "")
        return Summary(reason, len(st.arms), st.incumbent.key(), (st.incumbent_score or Score(True, 0, None)).objective,
                       len(st.moves), verdict)

    def _verdict(self, st: State) -> str | None:
        """``no shape satisfies …`` when the campaign has constraints and its incumbent still breaks
        them: nothing measured tonight can be recommended, production keeps its shape."""
        cons = self.camp.search.constraints
        wanted = cons.unmet(st.incumbent_score) if cons else []
        if not wanted:
            return None
        return (f"no shape satisfies {'; '.join(wanted)} (best violation {st.incumbent_score.violation:.2f}, "
                f"arm {st.incumbent_arm}): the production shape is kept")

    def _joint_proposal(self, st: State) -> Proposal:
        """Joint mode (for comparison): Optuna's sampler picks a whole shape from the lever space."""
        if not any(a.kind == "baseline" and a.verdict not in (None, "interrupted") for a in st.finished()):
            return Proposal("baseline", why="measure the starting shape")
        return Proposal("joint", why="Optuna's sampler over the whole lever space")

    def _ask_joint(self):
        dists = {name: CategoricalDistribution([json.dumps(encode_value(v), sort_keys=True) for v in lever.values])
                 for name, lever in self.camp.levers.items()}
        trial = self.study.ask(dists)
        shape = self.camp.baseline
        for name in self.camp.levers:
            v = json.loads(trial.params[name])
            shape = shape.with_change(name, decode_value(v))
        return trial.number, shape

    def _run_one(self, st: State, p: Proposal) -> None:
        n = st.next_n
        shape = apply(st.incumbent, p.change)
        if p.kind == "joint":
            trial, shape = self._ask_joint()
        else:
            trial = self._ask(p)
        crashpoint("asked", n)
        self.journal.append("arm_start", arm=n, kind=p.kind, shape=shape.to_dict(),
                            change=[p.change[0], encode_value(p.change[1])] if p.change else None,
                            incumbent=st.incumbent.key(), trial=trial, why=p.why)
        log.info("[arm %d START %s] %s — %s", n, p.kind,
                 f"{p.change[0]} -> {_fmt(p.change[1])}" if p.change else "the incumbent", p.why)
        crashpoint("started", n)
        numerics = self.camp.levers[p.change[0]].numerics if p.change else "preserving"
        if p.kind == "joint" and any(lv.numerics == "changing" and shape.value_of(name) != self.camp.baseline.value_of(name)
                                     for name, lv in self.camp.levers.items()):
            numerics = "changing"
        inc_depths = self._incumbent_depths(st)
        band = st.band
        inc_score = self._incumbent_score(st)
        try:
            rec = self.runner.run(n, shape, kind=p.kind, change=p.change, numerics=numerics, incumbent=inc_score,
                                  incumbent_depths=inc_depths, band=band, reference_arm=st.incumbent_arm)
        except (KeyboardInterrupt, SystemExit):
            self.journal.append("arm_end", arm=n, kind=p.kind, verdict="interrupted", reason="signal")
            self._tell(trial, {"verdict": "interrupted"})
            self.journal.append("told", arm=n, trial=trial)
            self.journal.append("campaign_end", reason="interrupted by a signal", arms=n + 1)
            raise
        self.journal.append("arm_end", **{k: v for k, v in rec.items() if k != "arm"}, arm=n)
        crashpoint("ended", n)
        if p.kind == "joint" and rec.get("verdict") == "better":       # joint mode: the best so far, no confirmation
            self.journal.append("incumbent", arm=n, shape=shape.to_dict(), score=rec["score"],
                                samples=[rec["score"]["objective"]], change=None, previous=st.incumbent.key(),
                                confirmed_arms=[n])
        if p.kind == "confirm" and rec.get("verdict") == "better":
            self._promote(replay(self.journal.records, self.camp.baseline), n)
            crashpoint("incumbent", n)
        self._tell(trial, rec)
        self.journal.append("told", arm=n, trial=trial)
        crashpoint("told", n)

    def _promote(self, st: State, n: int) -> None:
        """Move the incumbent to confirm arm ``n`` (idempotent: resume calls it too)."""
        if any(m.get("arm") == n for m in st.moves):
            return
        arm = st.arms[n]
        probe = max((a for a in st.finished() if a.kind == "probe" and a.change == arm.change and a.n < n),
                    key=lambda a: a.n)
        samples = [x for x in ((probe.end or {}).get("score", {}).get("objective"),
                               (arm.end or {}).get("score", {}).get("objective")) if x is not None]
        self.journal.append("incumbent", arm=n, shape=arm.shape.to_dict(), score=arm.end["score"], samples=samples,
                            change=[arm.change[0], encode_value(arm.change[1])], previous=arm.incumbent,
                            previous_value=encode_value(st.incumbent.value_of(arm.change[0])),
                            confirmed_arms=[probe.n, n])
        log.info("[arm %d INCUMBENT] %s -> %s confirmed by arms %d and %d", n, arm.change[0], _fmt(arm.change[1]),
                 probe.n, n)

    def _incumbent_score(self, st: State) -> Score | None:
        sc = st.incumbent_score
        if sc is None:
            return None
        obj = statistics.median(st.samples) if st.samples else sc.objective
        return Score(sc.feasible, sc.violation, obj)

    def _incumbent_depths(self, st: State) -> dict | None:
        if st.incumbent_arm is None:
            return None
        end = st.arms[st.incumbent_arm].end or {}
        return (end.get("measurement") or {}).get("depths")


def _fmt(v) -> str:
    from arms.shape import format_value

    return format_value(v)


def deadline_from(budget, host_now: float, wall_now: float | None = None) -> float | None:
    """The host-clock deadline for `until` (HH:MM, next occurrence) or `hours`."""
    if budget.hours is not None:
        return host_now + budget.hours * 3600
    if budget.until is None:
        return None
    wall_now = time.time() if wall_now is None else wall_now
    return host_now + (budget.until_epoch(wall_now) - wall_now)     # DST-safe (zoneinfo)
