"""Run one arm of a campaign: boot, measure (pruning hopeless arms after the first depth),
quality guard, constraints, verdict. Returns the record the journal keeps; never parses logs
itself (arms/ does) and never decides what to run next (tuner/search does)."""
from __future__ import annotations

import dataclasses

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Callable

from arms import quality
from arms.boot import BootLimits, boot_arm
from arms.host import Host
from arms.headroom import headroom_from
from arms.lifecycle import crashpoint
from arms.telemetry import apply_telemetry, expected_ranks, slab_bytes_from_plan, telemetry_window
from arms.measure import DepthResult, Measurement, MeasurePlan, measure_engine
from arms.profiles import EngineProfile
from arms.prompts import api_from_profile
from arms.secrets import Sealer
from arms.shape import Shape

from arms.steady import steady
from arms.verdict import Verdict, boot_failed
from tuner.night.compare import MIN_EFFECT
from tuner.night.verdict import Constraints, NoiseBand, Objective, Score, judge, objective_sigma

log = logging.getLogger("tuner.arm")


def _extend(m: Measurement, more: Measurement) -> Measurement:
    """``m`` with ``more``'s runs appended depth by depth (more runs in the same boot)."""
    depths = {d: DepthResult.of(d, r.runs + (more.depths[d].runs if d in more.depths else [])) if r.runs else r
              for d, r in m.depths.items()}
    return replace(m, depths=depths, outcome="invalid" if more.outcome == "invalid" else m.outcome,
                   reason=m.reason or more.reason, wall_s=(m.wall_s or 0) + (more.wall_s or 0))


def _merge(first: Measurement, rest: Measurement) -> Measurement:
    depths = {**first.depths, **rest.depths}
    bad = first.outcome == "invalid" or rest.outcome == "invalid"
    return replace(rest, depths=depths, outcome="invalid" if bad else "measured",
                   reason=first.reason or rest.reason, wall_s=(first.wall_s or 0) + (rest.wall_s or 0))


def verdict_text(rec: dict, change: tuple | None = None) -> str:
    """What an arm came to, for its one ``[arm N VERDICT v]`` log line (``log_verdict``): the
    change, then the engine's line for a failed boot, the reason for a pruned or invalid arm,
    the comparison's interval and error rate where there was one, else the objective against
    the incumbent and its band."""
    from arms import values

    head = f"{change[0]} -> {values.text(change[1])}: " if change else ""
    v = str(rec.get("verdict"))
    if v.startswith("boot-failed:"):
        return head + ((rec.get("boot") or {}).get("evidence") or ["no evidence line"])[0][:160]
    if v == "corrupt":
        return head + "; ".join(((rec.get("quality") or {}).get("evidence") or ["the quality guard rejected its text"])[:2])
    reason = str(rec.get("reason") or "")
    if v == "invalid" or reason.startswith("pruned"):
        return head + (reason or "no reason recorded")
    obj = (rec.get("score") or {}).get("objective")
    out = head + f"objective {'n/a' if obj is None else f'{obj:.2f}'}"
    c = rec.get("compare")
    if c:
        return (out + f", {c['effect']:+.1%} [{c['lo']:+.1%}, {c['hi']:+.1%}] vs the incumbent, runs {c['runs'][0]} vs "
                      f"{c['runs'][1]}, boots {c['boots'][0]} vs {c['boots'][1]}, error rate {c['alpha']:.2g}")
    if rec.get("delta") is not None:
        out += f" ({rec['delta']:+.1%} vs incumbent, band ±{rec['threshold']:.1%})"
    return out + (f" — {reason}" if reason else "")


def log_verdict(n: int, rec: dict, change: tuple | None = None) -> None:
    """The arm's final verdict, logged once, after any comparison changed it (tuner.night.loop)."""
    log.info("[arm %s VERDICT %s] %s", n, rec.get("verdict"), verdict_text(rec, change))


class ArmRunner:
    def __init__(self, host: Host, profile: EngineProfile, *, campaign: str, folder: Path, plan: MeasurePlan,
                 limits: BootLimits, objective: Objective, constraints: Constraints, min_effect: float = MIN_EFFECT,
                 prune_below: float = 0.30, extra_env: dict | None = None, telemetry: bool = False,
                 link_gbs: float | None = None, probe_interval_s: float = 2.0, sweep=None):
        self.host, self.profile, self.campaign, self.folder = host, profile, campaign, Path(folder)
        self.plan, self.limits, self.objective, self.constraints = plan, limits, objective, constraints
        self.min_effect, self.prune_below, self.extra_env = min_effect, prune_below, extra_env
        self.api = api_from_profile(profile)
        self.telemetry, self.link_gbs, self.probe_interval_s = telemetry, link_gbs, probe_interval_s
        self.last_boot = None
        self.sealer = Sealer()           # the campaign's secrets, hidden in the arm's files at its end
        self.sweep = sweep                 # arms.sweep.SweepPlan: the concurrency sweep each measured arm runs
        self.port: int | None = None       # this box serves its arms on this port (several boxes on one machine)

    @classmethod
    def for_campaign(cls, camp, host: Host, profile: EngineProfile, plan: MeasurePlan | None = None) -> "ArmRunner":
        s = camp.search
        runner = cls(host, profile, campaign=camp.name, folder=camp.folder, plan=plan or camp.measure,
                     limits=camp.boot, objective=s.objective, constraints=s.constraints, min_effect=s.min_effect,
                     prune_below=s.prune_below, telemetry=camp.telemetry, link_gbs=camp.link_gbs,
                     probe_interval_s=float(camp.probe_interval_s), sweep=camp.sweep_plan)
        runner.sealer = camp.sealer()
        return runner

    def arm_folder(self, n: int) -> Path:
        return self.folder / "arms" / f"{n:04d}"

    def reference(self, arm_n: int | None) -> Measurement | None:
        if arm_n is None:
            return None
        p = self.arm_folder(arm_n) / "measure.json"
        return Measurement.from_dict(json.loads(p.read_text())) if p.exists() else None

    def run(self, n: int, shape: Shape, *, folder: Path | None = None, **kw) -> dict:
        """One arm (see ``_run``); then no secret of the campaign stays in its folder's files
        (boot.log, boot.json, measure.json, telemetry) — sealed once the container is gone."""
        folder = folder or self.arm_folder(n)
        try:
            return self._run(n, shape, folder=folder, **kw)
        finally:
            for p in sorted(Path(folder).rglob("*")) if Path(folder).is_dir() else ():
                if p.is_file():
                    self.sealer.file(p)

    def _run(self, n: int, shape: Shape, *, kind: str, change: tuple | None, numerics: str,
             incumbent: Score | None, incumbent_depths: dict | None, band: NoiseBand,
             reference_arm: int | None, folder: Path, extend: Callable[[dict], int] | None = None) -> dict:
        """``extend``: asked after the measurement, while the engine is up, how many more runs per
        depth to measure in this boot (0: none); asked again after each extension."""
        changes = {change[0]: change[1]} if change else {}
        t0 = self.host.now()
        rec: dict = {"arm": n, "kind": kind}
        boot_shape = apply_telemetry(shape, self.profile) if self.telemetry else shape
        if self.port is not None:          # the port is where it serves, not what it is: the shape's key stays
            boot_shape = replace(boot_shape, port=self.port)
        with boot_arm(self.host, boot_shape, self.profile, campaign=self.campaign, arm=n, folder=folder,
                      changes=changes, limits=self.limits, extra_env=self.extra_env) as (boot, b):
            self.last_boot = boot
            rec["boot"] = {"outcome": boot.outcome, "boot_s": round(boot.boot_s, 3),
                           "evidence": list(boot.report.evidence[:3]), "flags_not_applied": boot.not_applied,
                           "report": boot.report.to_dict()}
            if boot.outcome != "ready":
                rec["verdict"] = boot_failed(boot.outcome)      # logged once, by the caller (log_verdict)
                return self._finish(rec, t0, folder)
            crashpoint("booted", n)
            t_measure = self.host.now()
            plan = replace(self.plan, max_model_len=boot.report.max_model_len or self.plan.max_model_len)
            with self.host.http_client(b.cid, timeout=plan.run_timeout_s) as http, \
                    self.host.probes(b.cid, interval_s=self.probe_interval_s) as probes:
                cond = self.host.conditions(b.cid)      # the box around each run: contended runs are marked
                first = measure_engine(b.base_url, replace(plan, depths=plan.depths[:1]), self.api, http=http,
                                       clock=self.host.now, conditions=cond)
                crashpoint("measuring", n)
                pruned = self._prune(first, incumbent_depths, plan.depths[0], kind)
                m = first if (pruned or len(plan.depths) == 1) else _merge(
                    first, measure_engine(b.base_url, replace(plan, depths=plan.depths[1:], warm_tokens=0), self.api,
                                          http=http, clock=self.host.now, conditions=cond))
                while extend is not None and not pruned and m.outcome == "measured":
                    k = extend(m.to_dict())
                    if k <= 0:
                        break
                    m = _extend(m, measure_engine(b.base_url, replace(plan, runs=k, warm_tokens=0), self.api,
                                                  http=http, clock=self.host.now, conditions=cond))
                rec["measure_s"] = round(self.host.now() - t_measure, 3)
                sweep = self._sweep(n, b) if self.sweep and not pruned and m.outcome == "measured" else None
                if self.telemetry and not pruned and m.outcome == "measured":
                    rec["telemetry"] = self._telemetry(b, http, boot, shape, m, folder)
            rec["probes"] = probes.to_dict()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "measure.json").write_text(json.dumps(m.to_dict(include_text=True), indent=1))
        mdict = m.to_dict()
        if sweep is not None:
            mdict["sweep"] = sweep
        rec["measurement"] = mdict
        settled = steady(mdict)               # warm-up left out of comparisons; a boot that never settled
        if settled.warmup_runs or settled.unstable:
            rec["steady"] = settled.to_dict()
            log.info("[arm %s STEADY] %s", n, settled.unstable or f"{settled.warmup_runs} warm-up run(s) left out")
        rec["noise"] = objective_sigma(mdict)
        q = quality.check(self.reference(reference_arm), m, numerics)
        rec["quality"] = q.to_dict()
        viol = self.constraints.violations(rec["boot"])
        obj = self.objective.value(mdict) if not pruned else None
        score = Score(feasible=not viol, violation=sum(viol.values()), objective=obj)
        rec["score"] = {"feasible": score.feasible, "violation": round(score.violation, 6), "objective": obj}
        rec["violations"] = viol
        # the runner's judgement; the loop settles the final verdict (tuner.night.verdict.settle)
        if q.verdict == Verdict.CORRUPT:
            rec["verdict"] = Verdict.CORRUPT.value
        elif m.outcome != "measured":             # the measurement could not be trusted
            rec["verdict"] = Verdict.INVALID.value
            rec["reason"] = m.reason
        elif pruned:
            rec["verdict"] = Verdict.WORSE.value
            rec["reason"] = pruned
        elif kind in ("probe", "confirm") and settled.unstable:   # its runs say nothing of a steady rate
            rec["verdict"] = Verdict.UNSTABLE.value
            rec["reason"] = settled.unstable
        elif kind in ("baseline", "recheck", "measure") or incumbent is None:
            rec["verdict"] = kind if kind in (Verdict.BASELINE, Verdict.RECHECK) else Verdict.MEASURED.value
        else:
            j = judge(score, incumbent, band, self.min_effect)
            rec["verdict"], rec["delta"], rec["threshold"] = j.verdict, j.delta, j.threshold
            if j.reason:
                rec["reason"] = j.reason
        log.debug("[arm %s JUDGED %s] %s (before any comparison; the caller logs the verdict)", n, rec["verdict"],
                  verdict_text(rec))
        return self._finish(rec, t0, folder)

    def _telemetry(self, b, http, boot, shape: Shape, m: Measurement, folder: Path) -> dict:
        tel = telemetry_window(self.host, b.cid, b.base_url, http, self.api, self.profile, depth=self.plan.depths[0],
                               requests=3, max_tokens=min(128, self.plan.max_tokens), stop_timeout_s=120.0,
                               dest_dir=folder / "telemetry", ranks=expected_ranks(shape),
                               slab_bytes=slab_bytes_from_plan(boot.report.plan), clock=self.host.now,
                               sleep=self.host.sleep)
        out = tel.to_dict()
        d0 = m.depths[self.plan.depths[0]]
        spec = shape.value_of("speculative-config")
        hr = headroom_from(tel.report, decode_tok_s=d0.median_decode_tok_s, acceptance=m.acceptance,
                           spec_k=int(spec.get("num_speculative_tokens", 0)) if hasattr(spec, "get") else 0,
                           mean_acceptance_length=m.mean_acceptance_length, link_gbs=self.link_gbs,
                           link_source="campaign measure.link_gbs" if self.link_gbs else None)
        if hr is not None:
            out["headroom"] = hr.to_dict()
        log.info("[arm %s TELEMETRY %s] %s", b.spec.name, tel.status, "; ".join(tel.findings()[:2]))
        return out

    def _prune(self, first: Measurement, inc_depths: dict | None, depth: int, kind: str) -> str | None:
        if kind != "probe" or not inc_depths or first.outcome != "measured":
            return None
        mine = first.depths[depth].median_decode_tok_s
        theirs = (inc_depths.get(str(depth)) or {}).get("median_decode_tok_s")
        if mine is None or not theirs:
            return None
        if mine < (1 - self.prune_below) * theirs:
            return f"pruned after depth {depth}: {mine:.2f} vs incumbent {theirs:.2f} tok/s"
        return None

    def _sweep(self, n: int, b) -> dict:
        """The concurrency sweep (goodput at the SLO, the knee) on the booted arm, wall clock."""
        from arms.sweep import run_sweep

        log.info("[arm %s SWEEP] concurrency %s, %g s each", n, ",".join(map(str, self.sweep.levels)),
                 self.sweep.duration_s)
        r = run_sweep(b.base_url, self.api, self.sweep)
        log.info("[arm %s SWEEP done] goodput_at_slo %.3f req/s%s, knee %s", n, r.goodput_at_slo,
                 f" @ concurrency {r.goodput_level}" if r.goodput_level else " (no level meets the SLO)", r.knee)
        return r.to_dict()

    def _finish(self, rec: dict, t0: float, folder: Path) -> dict:
        rec["arm_s"] = round(self.host.now() - t0, 3)
        rec["folder"] = str(folder)
        return rec
