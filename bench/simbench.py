"""Shared pieces of the simulated-time benchmarks: the landscape's truth about a shape, a
campaign file, a SimHost for it, and one measured arm outside the campaign loop (for the
exhaustive-sweep and random-search baselines)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from arms.argv import render_argv, render_env  # noqa: E402
from arms.boot import BootLimits  # noqa: E402
from arms.profiles import load_profile  # noqa: E402
from arms.shape import ABSENT, Shape  # noqa: E402
from host.simhost import SimHost  # noqa: E402
from simengine import planner  # noqa: E402
from simengine.cli import build_parser, shape_values  # noqa: E402
from tuner.night.arm_runner import ArmRunner  # noqa: E402
from tuner.night.campaign import load_campaign  # noqa: E402
from tuner.night.verdict import NoiseBand, Score  # noqa: E402

PARSER = build_parser()
DEPTHS = (166, 1087, 4064)
PROFILE = load_profile("simengine")


@dataclass(frozen=True)
class Truth:
    """What the landscape says about a shape, noise-free."""

    boots: bool
    corrupt: bool
    objective: float | None          # decode geomean over DEPTHS; None when it fails or corrupts
    violation: float                 # the campaign's constraint arithmetic on the boot report

    @property
    def feasible(self) -> bool:
        return self.boots and not self.corrupt and self.violation <= 1e-9

    def key(self) -> tuple:
        return Score(self.feasible, self.violation, self.objective).key() if self.objective else (False, -9e9, 0.0)


def truth(land, shape: Shape, constraints=None) -> Truth:
    ns = PARSER.parse_args(["serve"] + render_argv(shape))
    v = shape_values(ns, PARSER, render_env(shape))
    p = planner.make_plan(land, v)
    fails = any(planner.memory_failure(land, p, v, ph) for ph in ("startup", "plan", "kv", "graphs"))
    rules = planner.matching_rules(land, v)
    fails = fails or any(r.get("fail") is not None for r in rules)
    corrupt = any(r.get("corrupt") is not None for r in rules)
    if fails or corrupt:
        return Truth(not fails, corrupt, None, 9e9)
    rates = planner.decode_rates(land, v, p)
    obj = 1.0
    for d in DEPTHS:
        obj *= rates[d]
    report = {"kv_pool_tokens": p.kv_tokens, "max_concurrency_len": p.max_model_len,
              "max_concurrency": round(p.max_concurrency, 2)}
    viol = sum((constraints.violations({"report": report}) if constraints else {}).values())
    return Truth(True, False, obj ** (1 / len(DEPTHS)), viol)


def lever_values(spec) -> list:
    vals = spec["values"] if isinstance(spec, dict) else spec
    return [ABSENT if v == "absent" else v for v in vals]


def write_campaign(tmp: Path, name: str, *, args: dict, env: dict, levers: dict, measure: dict,
                   compile_cache: bool = True, **extra) -> Path:
    base = {"image": "localhost/offload-tuner-simengine:sim", "model": "/models/sim", "args": args, "env": env,
            "port": 8000}
    if compile_cache:
        base["compile_cache"] = str(tmp / name / "compile-cache")
    data = {"name": name, "engine": "simengine", "baseline": base, "levers": levers, "measure": measure,
            "journal": str(tmp / "journal"), **extra}
    p = tmp / f"{name}.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def sim_campaign(path: Path, seed: int, landscape: Path | None = None):
    """(campaign with its image pinned on the SimHost, host)."""
    return SimHost.pinned(load_campaign(path), landscape=str(landscape) if landscape else None, noise_seed=seed)


def arm_runner(camp, host) -> ArmRunner:
    """A runner with the campaign's measure plan, no probes (virtual time has no host to sample)."""
    return ArmRunner(host, PROFILE, campaign=camp.name, folder=camp.folder, plan=camp.measure,
                     limits=BootLimits(1200, 600, 1.0), objective=camp.search.objective,
                     constraints=camp.search.constraints, probe_interval_s=3600)


def measure_arm(runner: ArmRunner, n: int, shape: Shape) -> Score | None:
    """Boot and measure one shape; its Score, or None when it failed to boot or corrupted."""
    rec = runner.run(n, shape, kind="measure", change=None, numerics="preserving", incumbent=None,
                     incumbent_depths=None, band=NoiseBand(), reference_arm=None)
    if rec.get("verdict") != "measured" or (rec.get("quality") or {}).get("verdict") == "corrupt":
        return None
    sc = rec.get("score") or {}
    if sc.get("objective") is None:
        return None
    return Score(sc["feasible"], sc["violation"], sc["objective"])


def emit(lines: list[str], out: str | None) -> None:
    """Print a benchmark's results and write them to ``out`` (under bench/results/)."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).write_text(text)
