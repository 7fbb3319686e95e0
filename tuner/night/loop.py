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

from arms.errors import ConfigError
from arms.host import Host
from arms.lifecycle import crashpoint
from arms.profiles import EngineProfile

from tuner.night.ahead import supposing
from tuner.night.arm_runner import ArmRunner, log_verdict
from tuner.night.ending import (NoResult, continue_night, deadline_from, final_end, judged_start,  # noqa: F401
                                 no_result)
from tuner.night.sampler import OneChangeSampler
from arms import values
from tuner.night.guard import Guard
from tuner.night.journal import Journal
from tuner.night.judging import Judging
from tuner.night.opening import Opening, campaign_hash
from tuner.night.proposal import Proposal, apply
from tuner.night.search import propose
from tuner.night.state import Replay, State
from tuner.night.study import followed, open_study
from tuner.night.verdict import Score, needs_comparison, promotes, settle

log = logging.getLogger("tuner.loop")
WAIT_S = 30.0         # a box with nothing to run while other boxes measure looks again after this long
optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass
class Summary:
    reason: str
    arms: int
    incumbent_key: str
    incumbent_objective: float | None
    moves: int
    verdict: str | None = None      # "no shape satisfies …" when the constraints were never met
    no_result: NoResult | None = None   # the night learned nothing (tuner/night/ending.py): why, and the evidence


class CampaignLoop(Opening, Judging):
    """``deadline``: the host-clock deadline a *new* night gets (``deadline_from``); a night that
    started before keeps the one it journaled (``self.deadline`` is the night's, on the host
    clock). ``simulated``: journaled in campaign_start (default: whether ``host`` says it is)."""

    def __init__(self, camp, host: Host, profile: EngineProfile, *, deadline: float | None = None,
                 max_arms: int | None = None, force_resume: bool = False, stop: Callable[[], bool] | None = None,
                 on_arm: Callable[[State, dict], None] | None = None, simulated: bool | None = None,
                 facts: Callable[[], dict] | None = None, fleet=None):
        self.camp, self.host, self.profile = camp, host, profile
        self.fleet = fleet                  # a shared campaign's connection (tuner/night/shared.py), or None
        self.box = fleet.box if fleet is not None else None
        self._joined = -1                   # the seq of this box's "box joined" note (a shared campaign)
        self._asked: int | None = None      # a trial asked whose arm_start is not committed yet
        self.max_arms, self.force = max_arms, force_resume
        self.simulated = bool(host.simulated) if simulated is None else simulated
        self.facts = facts                  # what the host measured for a new night (journaled in campaign_start)
        self.stop = stop or (lambda: False)
        self.on_arm = on_arm
        folder = camp.folder
        folder.mkdir(parents=True, exist_ok=True)
        if fleet is None:
            self.journal = Journal(folder / "journal.jsonl", clock=host.wall, sealer=camp.sealer())
            self.study_at = folder / "optuna.journal"
        else:
            if camp.search.mode == "joint":
                raise ConfigError("search: joint cannot be shared across boxes (storage:); use one-change")
            from tuner.night.shared import SharedJournal

            from tuner.night.readback import mark_shared

            self.journal = SharedJournal(fleet, clock=fleet.now, sealer=camp.sealer())
            self.study_at = fleet.url
            from tuner.night.storage import without_password

            mark_shared(folder.parent, without_password(fleet.url), camp.name)   # readers of the folder find it
        self._proposed = deadline
        self._set_clock_and_deadline(deadline)
        self.sampler = OneChangeSampler() if camp.search.mode != "joint" else None
        self.study = self._atomic(lambda: open_study(self.study_at, camp.name, sampler=self.sampler,
                                                     metric=str(camp.search.objective)))
        self.runner = ArmRunner.for_campaign(camp, host, profile)
        if fleet is not None:
            self.runner.campaign = f"{camp.name}.{self.box}"     # this box's containers: its label and names
        self.choices = ["(incumbent)"] + sorted(camp.levers)
        self._boots: dict = {}              # (arm, end time) -> its Boot (tuner/night/blocks.py), for _compare

    def _set_clock_and_deadline(self, proposed: float | None) -> None:
        """A simulated host's clock continues from the journal's last time; the deadline is the
        night's, fixed at its start (tuner/night/ending.py)."""
        self.deadline_wall, self.deadline = continue_night(self.journal.records, self.host, self.camp.search.budget,
                                                           proposed, wall=self.journal.clock)
        self._judgeable = False        # the starting shape gave something to judge against (ending.no_result)

    def _atomic(self, fn):
        """``fn()`` as one transaction of a shared campaign (every box's records read first, the
        study reopened if another box rebuilt it; run again from the top when the database went
        away), or just ``fn()`` on one box."""
        if self.fleet is None:
            return fn()

        def followed_fn():
            if getattr(self, "study", None) is not None:     # another box may have rebuilt the shared study
                self.study = followed(self.study, self.study_at, self.camp.name, self.sampler,
                                      str(self.camp.search.objective))
            return fn()
        try:
            return self.fleet.atomically(followed_fn, on_rollback=self._forget)
        except BaseException:
            self._forget()
            raise

    def _forget(self) -> None:
        """A rolled-back transaction's records were folded: replay afresh; a trial it asked for
        (Optuna commits on its own connection) never became an arm: failed, so no trial of the
        study is left without its arm's verdict."""
        self._replayed = None
        asked, self._asked = getattr(self, "_asked", None), None
        if asked is not None:
            try:
                self._tell(asked, {"verdict": "interrupted"})
            except Exception as e:   # noqa: BLE001 - the database is away: the next start's reconcile fails it
                log.debug("[study] trial %s asked in a rolled-back transaction stays for the reconcile: %s", asked, e)

    def _replay(self) -> State:
        """The campaign state, folded incrementally from the journal (the records since last time)."""
        if getattr(self, "_replayed", None) is None:
            self._replayed = Replay(self.camp.baseline, self.camp.levers)
        return self._replayed.follow(self.journal)

    # -- start: identity, reconcile ----------------------------------------------------------
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
        while True:
            self._wait_quiet(st)          # another process held the last boot's runs: let it leave
            step = self._atomic(self._next_arm)
            if isinstance(step, _Stop):
                break
            if step is None:          # a shared campaign: nothing to give this box while others measure
                self.host.sleep(WAIT_S)
                continue
            self._measure(step)
            st = self._replay()
            if self.on_arm:
                self.on_arm(st, st.arms[step.n].end or {})
        return self._atomic(lambda: self._end_night(step))

    def _next_arm(self) -> "_Began | _Stop | None":
        """Why the night (or this box) stops, or the next arm, begun (its trial asked, its start
        journaled); None: a shared campaign whose other boxes may still make work."""
        st = self._replay()
        if self.fleet is not None:
            self._sweep_silent()
            st = self._replay()
            end = self._ended_elsewhere(st)
            if end is not None:
                return _Stop(str(end.get("reason")), campaign_wide=False)
        if self.stop():
            return _Stop("stopped", campaign_wide=self.fleet is None)
        nr = self._no_result(st)
        if nr is not None:
            return _Stop(f"no result: {nr.cause}", nr)        # the evidence line is in no_result
        if self.deadline is not None and self.host.now() >= self.deadline:
            return _Stop("deadline reached")
        if self.max_arms is not None and len(st.arms) >= self.max_arms:
            return _Stop(f"arm budget of {self.max_arms} reached")
        if self.camp.search.mode == "joint":
            p = self._joint_proposal(st)
        else:
            p = propose(st, self.camp.levers, recheck_every=self.camp.search.recheck_every,
                        confirm=self.camp.search.confirm, box=self.box)
        if p is None:
            if self.fleet is not None and any(a.box != self.box for a in st.open_arms):
                return None
            return _Stop(self._converged(st))
        if p.ahead is not None:             # at the incumbent-to-be (tuner/night/ahead.py)
            st = supposing(st, p.ahead)
        return self._begin(st, p)

    def _ended_elsewhere(self, st: State) -> dict | None:
        """A shared campaign's end journaled by another box since this one joined."""
        end = st.ended
        return end if end is not None and end.get("seq", -1) > self._joined else None

    def _end_night(self, stop: "_Stop") -> Summary:
        """The night's end: every trial told and ``campaign_end`` journaled — on a shared
        campaign only by the last box measuring (the others journal that they are done)."""
        st = self._replay()
        reason, nr = stop.reason, stop.no_result
        if self.fleet is not None:
            busy = [a.n for a in st.open_arms if a.box != self.box]
            ended = self._ended_elsewhere(st)
            if ended is not None or not stop.campaign_wide or busy:
                self.journal.append("note", text="box done", box=self.box, reason=reason,
                                    **({"measuring": busy} if busy else {}))
                log.info("[box %s END] %s%s", self.box, reason, f"; boxes still measuring arms {busy}" if busy else "")
                end = ended or {}
                return Summary(str(end.get("reason") or reason), len(st.arms), st.incumbent.key(), st.incumbent_value,
                               len(st.moves), end.get("verdict"), nr)
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
                            **({"no_result": nr.to_dict()} if nr else {}), **({"box": self.box} if self.box else {}))
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

    def _begin(self, st: State, p: Proposal) -> "_Began":
        """Ask the study for arm ``p``'s trial and journal its start (one transaction of a shared
        campaign: no other box can be given the same arm number or the same challenger)."""
        n = st.next_n
        shape = self.camp.baseline if p.kind == "start" else apply(st.incumbent, p.change)
        params = None
        if p.kind == "joint":
            trial, shape, params = self._ask_joint()
        else:
            trial = self._ask(p)
        self._asked = trial                  # until its arm_start is committed (``_forget``)
        crashpoint("asked", n)
        self.journal.append("arm_start", arm=n, kind=p.kind, shape=shape.to_dict(), identity=shape.key(),
                            change=[p.change[0], values.encode(p.change[1])] if p.change else None,
                            incumbent=st.incumbent.key(), trial=trial, why=p.why,
                            judged=st.judged(self.camp.search.min_effect),   # what it is judged against
                            **({"params": params} if params else {}), **({"box": self.box} if self.box else {}),
                            **({"ahead": p.ahead} if p.ahead is not None else {}))
        log.info("[arm %d START %s%s] %s — %s", n, p.kind, f" ahead of arm {p.ahead}" if p.ahead is not None else "",
                 f"{p.change[0]} -> {values.text(p.change[1])}" if p.change else "the incumbent", p.why)
        crashpoint("started", n)
        ref = self._reference_arm(st)
        return _Began(n, p, shape, trial, st.incumbent, ref, self._incumbent_depths(st, ref), st.band,
                      None if p.kind == "start" else self._incumbent_score(st), self._extender(st, p, shape, n))

    def _measure(self, b: "_Began") -> None:
        """Boot and measure arm ``b`` (holding nothing: other boxes go on), then judge it."""
        p, n = b.p, b.n
        self._asked = None                   # its start is journaled: the trial is the arm's
        crashpoint("measuring", n)          # its start is journaled (committed, on a shared campaign)
        numerics = self.camp.levers[p.change[0]].numerics if p.change else "preserving"
        if p.kind == "joint" and any(lv.numerics == "changing" and b.shape.value_of(name) != self.camp.baseline.value_of(name)
                                     for name, lv in self.camp.levers.items()):
            numerics = "changing"
        try:
            rec = self.runner.run(n, b.shape, kind=p.kind, change=p.change, numerics=numerics, incumbent=b.inc_score,
                                  incumbent_depths=b.inc_depths, band=b.band, reference_arm=b.reference,
                                  extend=b.extend)
        except (KeyboardInterrupt, SystemExit):
            self._atomic(lambda: self._interrupted(b))
            raise
        self._atomic(lambda: self._end_arm(b, dict(rec)))

    def _interrupted(self, b: "_Began") -> None:
        n = b.n
        self.journal.append("arm_end", arm=n, kind=b.p.kind, verdict="interrupted", reason="signal",
                            **({"box": self.box} if self.box else {}))
        log.warning("[arm %d VERDICT interrupted] a signal stopped the tuner mid-arm", n)
        self._tell(b.trial, {"verdict": "interrupted"})
        self.journal.append("told", arm=n, trial=b.trial)
        if self.fleet is None:
            self.journal.append("campaign_end", reason="interrupted by a signal", arms=n + 1)
        else:                           # one box stopped: the campaign goes on on the others
            self.journal.append("note", text="box done", box=self.box, reason="interrupted by a signal")

    def _end_arm(self, b: "_Began", rec: dict) -> None:
        """Arm ``b``'s comparison, verdict, and the incumbent's move when it won (one transaction
        of a shared campaign: the incumbent changes in one place). A challenger whose incumbent
        moved while it measured (another box promoted) is judged against the incumbent it was
        begun at, and cannot promote."""
        p, n, shape, trial = b.p, b.n, b.shape, b.trial
        st = self._replay()
        inc = b.incumbent
        moved = st.incumbent_key != inc.key()
        cmp = look = None
        needed = needs_comparison(p.kind, p.change, rec, self._comparable())
        if needed:
            cmp, look = self._compare(st, shape, rec.get("measurement"), arm=n, against=inc if moved else None)
        rec = settle(rec, cmp, required=needed)     # the arm's final verdict: one place (tuner.night.verdict)
        self.journal.append("arm_end", **{k: v for k, v in rec.items() if k != "arm"}, arm=n,
                            **({"box": self.box} if self.box else {}))
        log_verdict(n, rec, p.change)          # once, after the comparison (its interval in the line)
        if cmp is not None:
            self.journal.append("compare", arm=n, incumbent=inc.key(), look=look,
                                change=[p.change[0], values.encode(p.change[1])], comparison=cmp.to_dict())
        elif self._comparable() and not moved and (p.kind == "start" or p.kind == "recheck" and st.starts_at(inc.key())):
            st2 = self._replay()
            h2h, _ = self._compare(st2, st2.incumbent, None, against=self.camp.baseline)
            if h2h is not None:
                self.journal.append("compare", arm=n, incumbent=inc.key(), change=None, kind="head-to-head",
                                    comparison=h2h.to_dict())
                log.info("[arm %d HEAD-TO-HEAD] incumbent vs the starting shape: %s", n, h2h.interval_text())
        crashpoint("ended", n)
        if p.kind == "joint" and rec.get("verdict") == "better":       # joint mode: the best so far, no confirmation
            self.journal.append("incumbent", arm=n, shape=shape.to_dict(), identity=shape.key(), score=rec["score"],
                                samples=[rec["score"]["objective"]], change=None, previous=inc.key(),
                                confirmed_arms=[n])
        closed = None
        if not moved and cmp is not None and not promotes(p.kind, rec, rec.get("compare")):
            closed = self._closed_move(self._replay(), self._replay().arms[n], rec.get("compare"))
        if not moved and (closed is not None or promotes(p.kind, rec, rec.get("compare") if cmp is not None else None)):
            self._promote(self._replay(), n, closed)
            crashpoint("incumbent", n)
            if self.fleet is not None:          # comparisons begun ahead of this move may now close or win
                self._bracket(self._settled_wins(self._replay()), n)
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
        same = [a for a in st.finished() if a.shape == arm.shape and a.verdict != "corrupt" and (a.end or {}).get("score")
                and (a.n <= n or self.fleet is not None)]     # a fleet: its boots after n too (measured ahead)
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

    def _reference_arm(self, st: State) -> int | None:
        """The incumbent's arm a challenger's outputs and depths are checked against: the one that
        made it incumbent, or on a shared campaign this box's latest measured boot of it (its
        files are in this box's folder)."""
        if self.fleet is None:
            return st.incumbent_arm
        mine = [a.n for a in st.finished() if a.box == self.box and a.key == st.incumbent_key
                and ((a.end or {}).get("measurement") or {}).get("outcome") == "measured"]
        return mine[-1] if mine else st.incumbent_arm

    def _incumbent_depths(self, st: State, arm: int | None = None) -> dict | None:
        arm = st.incumbent_arm if arm is None else arm
        if arm is None:
            return None
        end = st.arms[arm].end or {}
        return (end.get("measurement") or {}).get("depths")


@dataclass(frozen=True)
class _Began:
    """An arm journaled as started, with what its measurement is judged against."""
    n: int
    p: Proposal
    shape: object
    trial: int
    incumbent: object               # the incumbent Shape it was begun at
    reference: int | None           # the incumbent arm its outputs are checked against
    inc_depths: dict | None
    band: object
    inc_score: Score | None
    extend: object


@dataclass(frozen=True)
class _Stop:
    """Why the loop stops; ``campaign_wide``: the night ends (not only this box's part of it)."""
    reason: str
    no_result: NoResult | None = None
    campaign_wide: bool = True


__all__ = ["CampaignLoop", "Summary", "campaign_hash", "deadline_from"]
