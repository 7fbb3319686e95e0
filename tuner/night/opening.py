"""The night's opening and the study kept in step with the journal: a part of ``CampaignLoop``
(a mixin, as ``tuner.night.judging``). At the start: the campaign's identity, the arms a crash cut
off (this box's: a shared campaign's other boxes are running theirs), the arms of a box gone silent
(tuner/night/shared.py), a win whose promotion the crash cut off, the page cache warmed once, the box's load at rest, and
the Optuna study reconciled to the journal. Then, all night: telling each trial what its arm
journaled, once its verdict is final."""
from __future__ import annotations

import logging
from dataclasses import replace

from optuna.trial import TrialState

from arms.conditions import FOREIGN_CORES_LIMIT
from arms.errors import ConfigError
from arms.lifecycle import model_paths, sweep_orphans
from arms.verdict import untrusted
from tuner.night.journal import refuse_orphaned
from tuner.night.readback import start_of
from tuner.night.sampler import told_as, trial_of
from tuner.night.sampler import tell as sampler_tell
from tuner.night.state import State
from tuner.night.study import fail_unclaimed, sync_study
from tuner.night.verdict import promotes

log = logging.getLogger("tuner.loop")
REST_NOTE = "box at rest"   # the journal note of the box's background load (``_box_at_rest``)
REST_S = 2.0           # seconds the box's load at rest is read over
WARM_BUDGET_S = 900.0  # a new night reads its model's files once, for at most this long (host/pagecache.py)
BUSY_NOTE = "box busy"     # the journal note of a wait for another process to leave the box (``_wait_quiet``)
QUIET_POLL_S = 30.0    # a wait for a quiet box (measure.quiet_wait_s) reads its load this often


def campaign_hash(camp) -> str:
    return camp.identity()


class Opening:
    """The start of a night and the study's tells (uses the loop's ``journal``, ``camp``, ``host``,
    ``runner``, ``study``, ``fleet``, ``box``, ``_replay``, ``_atomic``, ``_promote``, ``_bracket``)."""

    def _start(self) -> State:
        st = self._atomic(self._start_locked)
        if self.fleet is not None:             # the night's deadline is the first box's (journaled)
            self._set_clock_and_deadline(self._proposed)
            if self._warm:
                self._warm_page_cache()
        self._box_at_rest()
        return st

    def _box_at_rest(self) -> None:
        """The box's background: other processes' CPU load before this box's first boot of the
        night (no engine of ours runs: the orphans were swept), read once per night and box and
        journaled; a resume reads it back. Runs are judged contended only above it
        (``arms.conditions``): a load that was there all along is the box's, on both sides of every
        comparison."""
        said = [r for r in self.journal.records if r.get("op") == "note" and r.get("text") == REST_NOTE
                and r.get("box") == self.box]
        if said:
            cores = said[0].get("cores")
        else:
            got = self.host.rest_load(REST_S)
            self.journal.append("note", text=REST_NOTE, **({"box": self.box} if self.box else {}), **got)
            cores = got.get("cores")
            if cores is not None:
                log.info("[night REST] other processes use %.2f cores with no engine running: a run is contended "
                         "above %.2f", cores, cores + FOREIGN_CORES_LIMIT)
        if cores:
            self.runner.plan = replace(self.runner.plan, background_cores=float(cores))

    def _wait_quiet(self, st: State) -> None:
        """After a boot of this box whose runs another process held (``arms.conditions``: such runs
        are left out of every comparison), wait for the box to be quiet before the next boot, up to
        ``measure.quiet_wait_s`` (0: not at all) and never past the deadline: a boot measured while
        the tenant stays would be left out whole (its runs replaced up to the cap, ``Judging._extender``, then dropped).
        The wait is journaled (``box busy``: seconds waited, the load read, whether it left)."""
        mine = [a for a in st.finished() if a.box == self.box and (a.end or {}).get("measurement")]
        if not mine or mine[-1].n == getattr(self, "_quiet_after", None) or not any(
                r.get("contended") for d in (mine[-1].end["measurement"].get("depths") or {}).values()
                for r in d.get("runs") or []):
            return
        self._quiet_after = mine[-1].n          # one wait per such boot
        limit = self.runner.plan.background_cores + FOREIGN_CORES_LIMIT
        t0 = self.host.now()
        wait = self.camp.quiet_wait_s
        end = t0 + wait if self.deadline is None else min(t0 + wait, self.deadline)
        if end - t0 < QUIET_POLL_S or (self.max_arms is not None and len(st.arms) >= self.max_arms):
            return                              # the night ends before another boot: nothing to wait for
        cores = self.host.rest_load(REST_S).get("cores")
        if cores is None or cores < limit:
            return
        log.info("[night BUSY] another process uses %.2f cores (a run is contended above %.2f): waiting up to "
                 "%.0f s for the box to be quiet", cores, limit, end - t0)
        while cores is not None and cores >= limit and self.host.now() + QUIET_POLL_S <= end:
            self.host.sleep(QUIET_POLL_S)
            cores = self.host.rest_load(REST_S).get("cores")
        quiet = cores is not None and cores < limit      # unreadable: not known to be quiet
        self.journal.append("note", text=BUSY_NOTE, waited_s=round(self.host.now() - t0, 1), cores=cores,
                            quiet=quiet, after_arm=mine[-1].n, **({"box": self.box} if self.box else {}))
        log.info("[night BUSY] %s after %.0f s", "quiet" if quiet else
                 (f"still {cores:.2f} cores: going on" if cores is not None else "load unreadable: going on"),
                 self.host.now() - t0)

    def _start_locked(self) -> State:
        h = campaign_hash(self.camp)
        started = start_of(self.journal.records)
        if started and started.get("campaign_hash") != h and not self.force:
            old, new = started.get("campaign", {}), self.camp.record()
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            raise ConfigError(f"{self.camp.folder} was written by a different campaign file (keys that differ: "
                              f"{', '.join(diff) or 'none at top level'}); pass --force-resume to continue it anyway")
        self._warm = False
        if not started:
            refuse_orphaned(self.camp.folder, self.journal)
            self.journal.append("campaign_start", campaign_hash=h, campaign=self.camp.record(),
                                file=str(self.camp.path.resolve()), baseline=self.camp.baseline.to_dict(),
                                baseline_identity=self.camp.baseline.key(), deadline=self.deadline_wall,
                                simulated=self.simulated, **(self.facts() if self.facts else {}))
            if self.fleet is None:
                self._warm_page_cache()
            else:
                self._warm = True
        elif self.fleet is not None:
            self._warm = not any(a.box == self.box for a in self._replay().arms.values())
        else:
            self.journal.append("note", text="resumed", campaign_hash=h)
        if self.fleet is not None:
            self._joined = self.journal.append("note", text="box joined", box=self.box, campaign_hash=h)["seq"]
        removed = sweep_orphans(self.host, self.runner.campaign)
        st = self._replay()
        for a in st.open_arms:        # the tuner died inside this arm
            if a.box != self.box:
                continue              # another box's: it runs it now (or the silent-box sweep ends it)
            self.journal.append("arm_end", arm=a.n, kind=a.kind, verdict="interrupted",
                                reason="the tuner stopped mid-arm; its container was removed on resume",
                                orphans_removed=len(removed), **({"box": self.box} if self.box else {}))
            log.warning("[arm %s VERDICT interrupted] resumed after a crash", a.n)
        self._sweep_silent()
        st = self._replay()
        st = self._settled_wins(st)   # a win whose promotion the crash cut off
        st = self._bracket(st, None)
        self._reconcile_optuna(st)
        return self._replay()

    def _sweep_silent(self) -> None:
        """A shared campaign: the open arms of a box silent past the grace period (killed, its
        machine down) are journaled ``interrupted`` and their trials failed; the others go on.
        A trial no arm claims (an ask the database cut) is failed first (``fail_unclaimed``)."""
        if self.fleet is None:
            return
        fail_unclaimed(self.study, self._replay())
        silent = self.fleet.silent()
        if not silent:
            return
        for a in self._replay().open_arms:
            if a.box in silent:
                self.journal.append("arm_end", arm=a.n, kind=a.kind, verdict="interrupted", box=a.box,
                                    reason=f"box {a.box} went silent ({silent[a.box]:.0f} s without a heartbeat); "
                                           f"noticed by box {self.box}")
                log.warning("[arm %s VERDICT interrupted] box %s went silent %.0f s ago", a.n, a.box, silent[a.box])
                if a.trial is not None:
                    self._tell(a.trial, {"verdict": "interrupted"})
                    self.journal.append("told", arm=a.n, trial=a.trial)

    def _warm_page_cache(self) -> None:
        """A new night reads its model's files once before the first boot, so that the starting
        shape's first boot is not the only cold one (host/pagecache.py); journaled as a note."""
        got = self.host.warm_files(model_paths(self.camp.baseline), WARM_BUDGET_S)
        self.journal.append("note", text="page cache warmed", **got)
        log.info("[night WARM] read %d file(s), %.1f GiB in %.0f s%s before the first boot", got.get("files", 0),
                 got.get("bytes", 0) / 2**30, got.get("seconds", 0), "" if got.get("complete", True) else
                 f" (stopped at the {WARM_BUDGET_S:.0f} s budget)")

    def _reconcile_optuna(self, st: State) -> None:
        self.study = sync_study(self.study, self.study_at, self.camp.name, st, self.choices,
                                self.camp.levers, self.sampler, str(self.camp.search.objective))
        running = {t.number for t in self.study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING}
        by_trial = {a.trial: a for a in st.arms.values() if a.trial is not None}
        for t in self.study.get_trials(deepcopy=False):
            if t.state != TrialState.RUNNING:
                continue
            a = by_trial.get(t.number)
            if a is None or (a.end is None and a.box == self.box):
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
