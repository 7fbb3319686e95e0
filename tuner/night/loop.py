"""The campaign loop: resume, reconcile, then propose → arm → journal → tell until the budget
ends. The arm journal is the source of truth; the Optuna study (JournalFileBackend in the
campaign folder) is reconciled to it at every start, so the two never disagree after a crash.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from arms.errors import ConfigError
from arms.host import Host
from arms.lifecycle import crashpoint, model_paths, sweep_orphans
from arms.profiles import EngineProfile
from arms.verdict import untrusted

from tuner.night.arm_runner import ArmRunner, log_verdict
from tuner.night.readback import start_of
from tuner.night.ending import (NoResult, continue_night, deadline_from, final_end, judged_start,  # noqa: F401
                                 no_result)
from tuner.night.sampler import OneChangeSampler, told_as, trial_of
from tuner.night.sampler import tell as sampler_tell
from arms import values
from tuner.night.guard import Guard
from tuner.night.journal import Journal, refuse_orphaned
from tuner.night.judging import Judging
from tuner.night.search import Proposal, apply, propose
from tuner.night.state import Replay, State
from tuner.night.study import open_study, sync_study
from tuner.night.verdict import Score, needs_comparison, promotes, settle

log = logging.getLogger("tuner.loop")
WARM_BUDGET_S = 900.0  # a new night reads its model's files once, for at most this long (host/pagecache.py)
optuna.logging.set_verbosity(optuna.logging.WARNING)


def campaign_hash(camp) -> str:
    return camp.identity()


@dataclass
class Summary:
    reason: str
    arms: int
    incumbent_key: str
    incumbent_objective: float | None
    moves: int
    verdict: str | None = None      # "no shape satisfies …" when the constraints were never met
    no_result: NoResult | None = None   # the night learned nothing (tuner/night/ending.py): why, and the evidence


class CampaignLoop(Judging):
    """``deadline``: the host-clock deadline a *new* night gets (``deadline_from``); a night that
    started before keeps the one it journaled (``self.deadline`` is the night's, on the host
    clock). ``simulated``: journaled in campaign_start (default: whether ``host`` says it is)."""

    def __init__(self, camp, host: Host, profile: EngineProfile, *, deadline: float | None = None,
                 max_arms: int | None = None, force_resume: bool = False, stop: Callable[[], bool] | None = None,
                 on_arm: Callable[[State, dict], None] | None = None, simulated: bool | None = None,
                 facts: Callable[[], dict] | None = None):
        self.camp, self.host, self.profile = camp, host, profile
        self.max_arms, self.force = max_arms, force_resume
        self.simulated = bool(host.simulated) if simulated is None else simulated
        self.facts = facts                  # what the host measured for a new night (journaled in campaign_start)
        self.stop = stop or (lambda: False)
        self.on_arm = on_arm
        folder = camp.folder
        folder.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(folder / "journal.jsonl", clock=host.wall, sealer=camp.sealer())
        self._set_clock_and_deadline(deadline)
        self.sampler = OneChangeSampler() if camp.search.mode != "joint" else None
        self.study = open_study(folder / "optuna.journal", camp.name, sampler=self.sampler,
                                metric=str(camp.search.objective))
        self.runner = ArmRunner.for_campaign(camp, host, profile)
        self.choices = ["(incumbent)"] + sorted(camp.levers)
        self._boots: dict = {}              # (arm, end time) -> its Boot (tuner/night/blocks.py), for _compare

    def _set_clock_and_deadline(self, proposed: float | None) -> None:
        """A simulated host's clock continues from the journal's last time; the deadline is the
        night's, fixed at its start (tuner/night/ending.py)."""
        self.deadline_wall, self.deadline = continue_night(self.journal.records, self.host, self.camp.search.budget,
                                                           proposed)
        self._judgeable = False        # the starting shape gave something to judge against (ending.no_result)

    def _replay(self) -> State:
        """The campaign state, folded incrementally from the journal (the records since last time)."""
        if getattr(self, "_replayed", None) is None:
            self._replayed = Replay(self.camp.baseline, self.camp.levers)
        return self._replayed.follow(self.journal)

    # -- start: identity, reconcile ----------------------------------------------------------
    def _start(self) -> State:
        h = campaign_hash(self.camp)
        started = start_of(self.journal.records)
        if started and started.get("campaign_hash") != h and not self.force:
            old, new = started.get("campaign", {}), self.camp.record()
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            raise ConfigError(f"{self.camp.folder} was written by a different campaign file (keys that differ: "
                              f"{', '.join(diff) or 'none at top level'}); pass --force-resume to continue it anyway")
        if not started:
            refuse_orphaned(self.camp.folder, self.journal)
            self.journal.append("campaign_start", campaign_hash=h, campaign=self.camp.record(),
                                file=str(self.camp.path.resolve()), baseline=self.camp.baseline.to_dict(),
                                baseline_identity=self.camp.baseline.key(), deadline=self.deadline_wall,
                                simulated=self.simulated, **(self.facts() if self.facts else {}))
            self._warm_page_cache()
        else:
            self.journal.append("note", text="resumed", campaign_hash=h)
        removed = sweep_orphans(self.host, self.camp.name)
        st = self._replay()
        for a in st.open_arms:        # the tuner died inside this arm
            self.journal.append("arm_end", arm=a.n, kind=a.kind, verdict="interrupted",
                                reason="the tuner stopped mid-arm; its container was removed on resume",
                                orphans_removed=len(removed))
            log.warning("[arm %s VERDICT interrupted] resumed after a crash", a.n)
        st = self._replay()
        for a in st.finished():       # a confirmed win whose promotion the crash cut off
            if a.change and promotes(a.kind, a.end, (a.end or {}).get("compare")) and a.incumbent == st.incumbent.key():
                self._promote(st, a.n)
                st = self._replay()
        for (inc, _, _), c in st.latest_comparisons().items():     # a bracketed win the crash cut off
            a = st.arms.get(c.get("arm"))
            if inc == st.incumbent.key() and a is not None and a.change and promotes(a.kind, None, c):
                self._promote(st, a.n, {k: v for k, v in c.items() if k != "arm"})
                st = self._replay()
        st = self._bracket(st, None)
        self._reconcile_optuna(st)
        return self._replay()

    def _warm_page_cache(self) -> None:
        """A new night reads its model's files once before the first boot, so that the starting
        shape's first boot is not the only cold one (host/pagecache.py); journaled as a note."""
        got = self.host.warm_files(model_paths(self.camp.baseline), WARM_BUDGET_S)
        self.journal.append("note", text="page cache warmed", **got)
        log.info("[night WARM] read %d file(s), %.1f GiB in %.0f s%s before the first boot", got.get("files", 0),
                 got.get("bytes", 0) / 2**30, got.get("seconds", 0), "" if got.get("complete", True) else
                 f" (stopped at the {WARM_BUDGET_S:.0f} s budget)")

    def _reconcile_optuna(self, st: State) -> None:
        self.study = sync_study(self.study, self.camp.folder / "optuna.journal", self.camp.name, st, self.choices,
                                self.camp.levers, self.sampler, str(self.camp.search.objective))
        running = {t.number for t in self.study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING}
        by_trial = {a.trial: a for a in st.arms.values() if a.trial is not None}
        for t in self.study.get_trials(deepcopy=False):
            if t.state != TrialState.RUNNING:
                continue
            a = by_trial.get(t.number)
            if a is None or a.end is None:
                self.study.tell(t.number, state=TrialState.FAIL)       # asked, never became an arm
        for a in st.arms.values():
            if self._awaits_bracket(st, a) and not a.told:
                continue                    # told once its blocks close (``_bracket``)
            if a.end is not None and a.trial is not None and (not a.told or a.trial in running):   # a torn tell
                self._tell(a.trial, a.end)
                self.journal.append("told", arm=a.n, trial=a.trial)

    def _tell_waiting(self, st: State, current: int | None) -> None:
        """Tell the trials of arms that waited for a bracket and no longer do (decided, or the
        incumbent moved on), in arm order; never the arm running now (``current``: it tells its own)."""
        for a in st.finished():
            if a.n != current and a.change and a.trial is not None and not a.told and a.kind in ("probe", "confirm") \
                    and not self._awaits_bracket(st, a):
                t = trial_of(self.study, a.trial)
                if t is not None and t.state == TrialState.RUNNING:
                    self._tell(a.trial, a.end)
                    self.journal.append("told", arm=a.n, trial=a.trial)

    def _tell(self, trial: int, end: dict) -> None:
        t = trial_of(self.study, trial)
        if t is None or t.state != TrialState.RUNNING:
            return
        if self.sampler is not None:            # the one-change study: its best trial is the incumbent
            moved = next((r for r in self._replay().moves if r.get("arm") == end.get("arm")), None)
            chained = moved is not None or end.get("kind", "baseline") == "baseline"   # else told_as ignores it
            done = [x.value for x in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))] if chained else []
            sampler_tell(self.study, trial, *told_as(end, moved, max(done) if done else None))
            return
        obj = (end.get("score") or {}).get("objective")
        if not untrusted(end.get("verdict")) and obj is not None:
            self.study.tell(trial, obj)
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    # -- the loop -------------------------------------------------------------------------------
    def _ask(self, p: Proposal) -> int:
        lever = p.change[0] if p.change else "(incumbent)"
        value = values.param(*p.change) if p.change else p.kind
        if self.sampler is not None:
            self.sampler.propose(p)             # the policy decides; the study's sampler hands it to Optuna
        else:
            self.study.enqueue_trial({"lever": lever}, user_attrs={"value": value, "kind": p.kind})
        trial = self.study.ask({"lever": CategoricalDistribution(self.choices)})
        return trial.number

    def run(self) -> Summary:
        done = self._already_ended()
        if done is not None:
            return done
        st = self._start()
        guard = Guard(self.camp.production, self.host, self.journal)
        guard.enter()
        try:
            return self._loop(st)
        finally:
            guard.exit()

    def _already_ended(self) -> Summary | None:
        """The night's summary, writing nothing, when it ended and nothing can resume it
        (``ending.final_end``): a re-run of a finished night leaves its journal as it was."""
        past = self.deadline is not None and self.host.now() >= self.deadline
        end = final_end(self.journal.records, campaign_hash(self.camp), past)
        if end is None:
            return None
        st = self._replay()
        log.info("[campaign END] already ended (%s) after %d arms: nothing to resume", end.get("reason"), len(st.arms))
        return Summary(str(end.get("reason")), len(st.arms), st.incumbent.key(), st.incumbent_value, len(st.moves),
                       end.get("verdict"), NoResult.from_dict(end.get("no_result")))

    def _no_result(self, st: State) -> NoResult | None:
        """``ending.no_result``, asked until the starting shape gave something to judge against."""
        cons = bool(self.camp.search.constraints)
        if self._judgeable or judged_start(st, cons):
            self._judgeable = True
            return None
        boots = 2 if self.camp.search.recheck_every and self.camp.search.mode != "joint" else 1
        return no_result(st, boots=boots, objective=str(self.camp.search.objective), constraints=cons)

    def _loop(self, st: State) -> Summary:
        arms_run = 0
        reason = "converged: no one-change neighbour left to try"
        nr = None
        while True:
            if self.stop():
                reason = "stopped"
                break
            nr = self._no_result(st)
            if nr is not None:
                reason = f"no result: {nr.cause}"        # the evidence line is in no_result
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
                reason = self._converged(st)
                break
            self._run_one(st, p)
            arms_run += 1
            st = self._replay()
            if self.on_arm:
                self.on_arm(st, st.arms[st.next_n - 1].end or {})
        self._tell_waiting(st, None)    # the night ends: every trial told (a win still waiting for its
        for a in st.finished():         # bracket is not a move)
            if a.trial is not None and not a.told and self._awaits_bracket(st, a):
                self._tell(a.trial, {**a.end, "verdict": "undecided"})
                self.journal.append("told", arm=a.n, trial=a.trial)
        verdict = self._verdict(st)
        self.journal.append("campaign_end", reason=reason, arms=len(st.arms),
                            incumbent=st.incumbent.to_dict() if st.incumbent else None, verdict=verdict,
                            error_rate=self.error_rate, undecided=self._undecided(st),
                            judged=st.judged(self.camp.search.min_effect),
                            **({"no_result": nr.to_dict()} if nr else {}))
        log.info("[campaign END] %s after %d arms%s", reason, len(st.arms), f" — {verdict}" if verdict else "")
        return Summary(reason, len(st.arms), st.incumbent.key(), st.incumbent_value,
                       len(st.moves), verdict, nr)

    def _undecided(self, st: State) -> list[str]:
        """The challengers of the final incumbent whose latest comparison is undecided."""
        cmp = {}
        for r in st.comparisons:
            if r.get("change") and r["incumbent"] == st.incumbent.key():
                cmp[f"{r['change'][0]}={values.text_of(r['change'][1])}"] = r["comparison"]["verdict"]
        return sorted(k for k, v in cmp.items() if v == "undecided")

    def _converged(self, st: State) -> str:
        undecided = len(self._undecided(st))
        if undecided:
            return (f"converged: {undecided} challenger(s) still undecided at their boot cap, every other "
                    f"one decided at error rate {self.error_rate:g}")
        return f"converged: every challenger decided at error rate {self.error_rate:g}"

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
        """A whole shape from Optuna; its params are the levers' sealed choices (arms.values)."""
        dists = {name: CategoricalDistribution(values.choices(name, lever.values))
                 for name, lever in self.camp.levers.items()}
        trial = self.study.ask(dists)
        shape = self.camp.baseline
        for name, lever in self.camp.levers.items():
            shape = shape.with_change(name, values.from_choice(name, lever.values, trial.params[name]))
        return trial.number, shape, dict(trial.params)

    def _run_one(self, st: State, p: Proposal) -> None:
        n = st.next_n
        shape = self.camp.baseline if p.kind == "start" else apply(st.incumbent, p.change)
        params = None
        if p.kind == "joint":
            trial, shape, params = self._ask_joint()
        else:
            trial = self._ask(p)
        crashpoint("asked", n)
        self.journal.append("arm_start", arm=n, kind=p.kind, shape=shape.to_dict(), identity=shape.key(),
                            change=[p.change[0], values.encode(p.change[1])] if p.change else None,
                            incumbent=st.incumbent.key(), trial=trial, why=p.why,
                            judged=st.judged(self.camp.search.min_effect),   # what it is judged against
                            **({"params": params} if params else {}))
        log.info("[arm %d START %s] %s — %s", n, p.kind,
                 f"{p.change[0]} -> {values.text(p.change[1])}" if p.change else "the incumbent", p.why)
        crashpoint("started", n)
        numerics = self.camp.levers[p.change[0]].numerics if p.change else "preserving"
        if p.kind == "joint" and any(lv.numerics == "changing" and shape.value_of(name) != self.camp.baseline.value_of(name)
                                     for name, lv in self.camp.levers.items()):
            numerics = "changing"
        inc_depths = self._incumbent_depths(st)
        band = st.band
        inc_score = None if p.kind == "start" else self._incumbent_score(st)
        try:
            rec = self.runner.run(n, shape, kind=p.kind, change=p.change, numerics=numerics, incumbent=inc_score,
                                  incumbent_depths=inc_depths, band=band, reference_arm=st.incumbent_arm,
                                  extend=self._extender(st, p, shape, n))
        except (KeyboardInterrupt, SystemExit):
            self.journal.append("arm_end", arm=n, kind=p.kind, verdict="interrupted", reason="signal")
            log.warning("[arm %d VERDICT interrupted] a signal stopped the tuner mid-arm", n)
            self._tell(trial, {"verdict": "interrupted"})
            self.journal.append("told", arm=n, trial=trial)
            self.journal.append("campaign_end", reason="interrupted by a signal", arms=n + 1)
            raise
        cmp = look = None
        needed = needs_comparison(p.kind, p.change, rec, self._comparable())
        if needed:
            cmp, look = self._compare(st, shape, rec.get("measurement"), arm=n)
        rec = settle(rec, cmp, required=needed)     # the arm's final verdict: one place (tuner.night.verdict)
        self.journal.append("arm_end", **{k: v for k, v in rec.items() if k != "arm"}, arm=n)
        log_verdict(n, rec, p.change)          # once, after the comparison (its interval in the line)
        if cmp is not None:
            self.journal.append("compare", arm=n, incumbent=st.incumbent.key(), look=look,
                                change=[p.change[0], values.encode(p.change[1])], comparison=cmp.to_dict())
        elif self._comparable() and (p.kind == "start" or p.kind == "recheck" and st.starts_at(st.incumbent.key())):
            st2 = self._replay()
            h2h, _ = self._compare(st2, st2.incumbent, None, against=self.camp.baseline)
            if h2h is not None:
                self.journal.append("compare", arm=n, incumbent=st.incumbent.key(), change=None, kind="head-to-head",
                                    comparison=h2h.to_dict())
                log.info("[arm %d HEAD-TO-HEAD] incumbent vs the starting shape: %s", n, h2h.interval_text())
        crashpoint("ended", n)
        if p.kind == "joint" and rec.get("verdict") == "better":       # joint mode: the best so far, no confirmation
            self.journal.append("incumbent", arm=n, shape=shape.to_dict(), identity=shape.key(), score=rec["score"],
                                samples=[rec["score"]["objective"]], change=None, previous=st.incumbent.key(),
                                confirmed_arms=[n])
        if promotes(p.kind, rec, rec.get("compare") if cmp is not None else None):
            self._promote(self._replay(), n)
            crashpoint("incumbent", n)
        elif cmp is None:
            self._bracket(self._replay(), n)      # an incumbent boot may close a waiting challenger's blocks
        st3 = self._replay()
        if not self._awaits_bracket(st3, st3.arms[n]):
            self._tell(trial, rec)
            self.journal.append("told", arm=n, trial=trial)
        crashpoint("told", n)

    def _promote(self, st: State, n: int, comparison: dict | None = None) -> None:
        """Move the incumbent to confirm arm ``n`` (idempotent: resume calls it too); ``comparison``:
        the one that promoted it when it is not the arm's own (a bracketed one)."""
        if any(m.get("arm") == n for m in st.moves):
            return
        arm = st.arms[n]
        same = [a for a in st.finished() if a.shape == arm.shape and a.n <= n and a.verdict != "corrupt"
                and (a.end or {}).get("score")]
        samples = [a.end["score"]["objective"] for a in same if a.end["score"].get("objective") is not None]
        comparison = comparison or (arm.end or {}).get("compare")
        extra = {"comparison": comparison} if comparison else {}
        self.journal.append("incumbent", arm=n, shape=arm.shape.to_dict(), identity=arm.key, score=arm.end["score"],
                            samples=samples,
                            change=[arm.change[0], values.encode(arm.change[1])], previous=arm.incumbent,
                            previous_value=values.encode(st.incumbent.value_of(arm.change[0])),
                            confirmed_arms=[a.n for a in same], **extra)
        log.info("[arm %d INCUMBENT] %s -> %s confirmed by arms %s", n, arm.change[0], values.text(arm.change[1]),
                 ", ".join(str(a.n) for a in same))

    def _incumbent_score(self, st: State) -> Score | None:
        sc = st.incumbent_score
        if sc is None:
            return None
        return Score(sc.feasible, sc.violation, st.incumbent_value)

    def _incumbent_depths(self, st: State) -> dict | None:
        if st.incumbent_arm is None:
            return None
        end = st.arms[st.incumbent_arm].end or {}
        return (end.get("measurement") or {}).get("depths")


__all__ = ["CampaignLoop", "Summary", "campaign_hash", "deadline_from"]
