"""What a promotion reads and checks, apart from the writing (tuner/production/promote.py): the campaign
folder's production section and journal, the arm to promote and why, the production file and
its rendering, and the health and smoke checks against the running service."""
from __future__ import annotations

import contextlib
import difflib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from arms.argv import REDACTED, is_secret
from arms.errors import ConfigError
from arms.measure import MeasurePlan, measure_engine
from arms.profiles import EngineProfile, load_profile
from arms.prompts import api_from_profile
from arms.readiness import ReadinessProbe, probe_once
from arms.secrets import looks_secret
from arms.shape import Shape
from arms.verdict import Verdict, untrusted

from arms import values
from tuner.production import envfile, units
from tuner.night.guard import Production
from tuner.night.schema import Journaled
from tuner.night.journal import Journal
from tuner.night.state import State, replay

DEFAULT_QUADLET_DIR = "/etc/containers/systemd"
DEFAULT_UNIT_DIR = "/etc/systemd/system"
Smoke = Callable[[str, int], "tuple[float | None, dict]"]


@dataclass(frozen=True)
class Context:
    folder: Path
    journal: Journal
    state: State
    baseline: Shape
    name: str
    base_dir: Path
    production: Production
    profile: EngineProfile
    plan: MeasurePlan
    min_effect: float
    secrets: dict            # secret env values of the campaign file's baseline (the journal redacts them)
    simulated: bool = False  # campaign_start says the night ran on a simulated host (promote refuses it)


@dataclass(frozen=True)
class Target:
    form: str
    path: Path
    unit: str
    container: str


@dataclass(frozen=True)
class Choice:
    n: int
    shape: Shape
    end: dict
    why: str


def campaign_file(folder: Path, start: dict) -> Path:
    """The campaign file a night was run from, never relative to the current directory: the
    journaled path when absolute; a relative one (an older tuner journaled it as given) from
    the directory whose ``journal:`` key leads to ``folder``."""
    from tuner.night.campaign import _resolve_path

    here = Path(folder).resolve()
    if not start.get("file"):
        return here / "campaign.yaml"
    f = Path(str(start["file"]))
    if f.is_absolute():
        return f
    raw = start.get("campaign") or {}
    jkey = os.path.expanduser(str(raw.get("journal", "journal")))
    if not Path(jkey).is_absolute():           # an absolute journal: key says nothing of where the file was
        for base in here.parents:
            if Path(_resolve_path(base, jkey)) / str(raw.get("name", here.name)) == here:
                return base / f.name
    return here / f.name


def load_context(folder: str | os.PathLike, writer: bool = True) -> Context:
    """The campaign folder read for a promotion; ``writer=False`` (a dry run) only reads, the
    writer opens the journal to append (under the folder's lock, tuner/production/promote.py)."""
    from tuner.night.readback import read_journal, start_of

    folder = Path(folder)
    jpath = folder / "journal.jsonl"
    if not jpath.exists():
        raise ConfigError(f"{folder} holds no journal.jsonl: not a campaign folder, or the campaign never ran")
    journal = Journal(jpath) if writer else read_journal(jpath)
    start = start_of(journal.records)
    if start is None:
        raise ConfigError(f"{jpath} has no campaign_start record")
    raw, file = dict(start.get("campaign") or {}), campaign_file(folder, start)
    prod_raw, where, secrets = raw.get("production"), f"{file} (as journaled)", {}
    if file.exists():            # the operator may have completed the section after the night
        with contextlib.suppress(OSError, yaml.YAMLError, AttributeError, TypeError):
            current = yaml.safe_load(file.read_text())
            if current.get("name") == raw.get("name"):
                env = (current.get("baseline") or {}).get("env") or {}
                secrets = {str(k): str(v) for k, v in env.items() if is_secret(str(k)) or looks_secret(str(v))}
                if current.get("production"):
                    prod_raw, where = current["production"], str(file)
    prod = Production.from_mapping(prod_raw, where)
    if prod is None:
        raise ConfigError(f"{file}: the campaign has no production section; add production: {{unit: NAME.service, "
                          "promote_as: quadlet | unit | env-file, ...} to promote")
    if prod.promote_as is None:
        raise ConfigError(f"{where}: key 'production.promote_as': say how production runs: quadlet (a podman "
                          ">= 4.4 .container file), unit (a plain systemd unit running podman run) or env-file")
    baseline = Shape.from_dict(start["baseline"])
    camp = Journaled(raw)
    profile = load_profile(prod.profile or camp.engine, raw.get("profile") or None)
    return Context(folder=folder, journal=journal, state=replay(journal.records, baseline), baseline=baseline,
                   name=str(camp.name or folder.name), base_dir=file.parent, production=prod, profile=profile,
                   plan=camp.measure.plan(), min_effect=float(camp.noise.min_effect), secrets=secrets,
                   simulated=start.get("simulated") is True)


def choose(st: State, arm: int | None, force: bool) -> Choice:
    """The arm to promote, or ConfigError saying why not."""
    finished = st.finished()
    if not finished:
        raise ConfigError("the campaign has no finished arms yet: nothing to promote (`tuner run` it first)")
    confirmed = {n for m in st.moves for n in m.get("confirmed_arms", [m["arm"]])}
    winners = [Shape.from_dict(m["shape"]) for m in st.moves]
    if arm is None:
        if not st.moves:
            base = min(finished, key=lambda a: a.n)
            if not force:
                raise ConfigError(f"the night confirmed no winner: the final incumbent is still the baseline "
                                  f"(arm {base.n}), which is what production runs; pass --arm N --force to "
                                  "promote another arm anyway")
            arm = base.n
        else:
            arm = st.moves[-1]["arm"]
            sc = st.moves[-1].get("score") or {}
            if sc.get("feasible") is False and not force:
                raise ConfigError(f"no shape satisfies the campaign's constraints: the final incumbent (arm {arm}) "
                                  f"still breaks them (violation {sc.get('violation', 0):.2f}); production keeps its "
                                  "shape (--arm N --force promotes an arm anyway)")
    a = st.arms.get(arm)
    if a is None or a.end is None:
        known = ", ".join(str(x.n) for x in sorted(finished, key=lambda x: x.n)[-8:])
        raise ConfigError(f"arm {arm} {'has not finished' if a else 'does not exist'} (finished arms: ... {known})")
    verdict = str(a.verdict)
    if untrusted(verdict) or not (a.end.get("measurement") or {}).get("depths"):
        raise ConfigError(f"arm {arm} came to {verdict}: it never served a trusted measurement and cannot be "
                          "promoted, not even with --force")
    change = f" ({values.change_text(a.change)})" if a.change else ""
    if arm in confirmed or (a.shape in winners and a.kind in ("recheck", "confirm")):
        return Choice(arm, a.shape, a.end, f"arm {arm}{change}: better, confirmed by a second boot")
    if verdict == Verdict.BETTER:
        conf = [c for c in finished if c.kind == "confirm" and c.shape == a.shape and c.n > arm]
        why = (f"arm {arm}{change} was better but its confirming arm {conf[0].n} came out {conf[0].verdict}"
               if conf else f"arm {arm}{change} was better but never confirmed by a second boot")
    else:
        why = f"arm {arm}{change} was {verdict}, not better"
    if not force:
        raise ConfigError(f"{why}; only a better arm confirmed by a second boot is promoted (--force promotes it anyway)")
    return Choice(arm, a.shape, a.end, f"{why} — promoted with --force")


def target_of(ctx: Context) -> Target:
    prod = ctx.production
    stem = prod.unit.removesuffix(".service")

    def resolve(p: str) -> Path:
        q = Path(os.path.expanduser(p))
        return q if q.is_absolute() else (ctx.base_dir / q).resolve()

    user = prod.scope == "user"
    if prod.promote_as == "quadlet":
        default = "~/.config/containers/systemd" if user else DEFAULT_QUADLET_DIR
        path = resolve(prod.quadlet_dir or default) / f"{stem}.container"
    elif prod.promote_as == "unit":
        path = resolve(prod.unit_file or f"{'~/.config/systemd/user' if user else DEFAULT_UNIT_DIR}/{prod.unit}")
    else:
        path = resolve(prod.env_file)
    return Target(prod.promote_as, path, prod.unit, stem)


def podman_version(host, prod: Production) -> str:
    if prod.podman_version:
        return prod.podman_version
    version = host.podman_version()
    if not version:
        raise ConfigError("cannot tell the podman version (no `podman --version`); set production.podman_version")
    return version


def unredact(shape: Shape, ctx: Context, target: Target, existing: str | None) -> Shape:
    """The journal keeps secret env values as ***: take them back from the production file
    (what runs now), else the campaign file's baseline env; refuse, naming them, if neither has them."""
    mapping = envfile.mapping_of(ctx.production.mapping) if target.form == "env-file" else {}
    hidden = [k for k, v in shape.env if v == REDACTED            # sealed by its name or by its look
              and (target.form != "env-file" or f"env.{k}" in mapping)]
    if not hidden:
        return shape
    known: dict[str, str] = {}
    if existing and target.form == "env-file":
        now = units.parse_env_file(existing)
        known = {key[4:]: now[var] for key, var in mapping.items() if key.startswith("env.") and var in now}
    elif existing:
        with contextlib.suppress(ConfigError, ValueError):
            known = dict(parse_file(target.form, existing, ctx.profile.family).shape.env)
    known = {k: v for k, v in {**ctx.secrets, **known}.items() if v != REDACTED}
    missing = [k for k in hidden if k not in known]
    if missing:
        raise ConfigError(f"the journal keeps {', '.join(missing)} redacted and neither {target.path} nor the "
                          "campaign file's baseline env holds the value: add it to the campaign file's baseline "
                          "env and promote again")
    return replace(shape, env=tuple((k, known[k] if k in hidden else v) for k, v in shape.env))


def render(ctx: Context, target: Target, choice: Choice, host, existing: str | None) -> str:
    label = f"{ctx.name}/arm{choice.n}"
    shape = unredact(choice.shape, ctx, target, existing)
    if target.form == "env-file":
        units.check_mapping(ctx.baseline, choice.shape, ctx.production.mapping)
        return units.render_env_file(shape, ctx.production.mapping, label=label, existing=existing or "")
    boot_s = (choice.end.get("boot") or {}).get("boot_s")
    kw = {"style": ctx.profile.family, "container_name": target.container, "label": label,
          "timeout_s": units.timeout_start_s(boot_s), "kept": units.kept_sections(existing)}
    if target.form == "quadlet":
        return units.render_quadlet(shape, podman_version=podman_version(host, ctx.production), **kw)
    return units.render_service(shape, **kw)


def parse_file(form: str, text: str, style: str) -> units.ParsedUnit:
    return (units.parse_quadlet if form == "quadlet" else units.parse_service)(text, style)


def same_shape(a: str, b: str) -> bool:
    """Two renderings of one shape (only the promotion label differs)."""
    def norm(t: str) -> str:
        t = re.sub(r"tuner\.promoted=[^\s\\\"]+", "", t)
        return "\n".join(x for x in t.splitlines() if not x.startswith((units.HEADER, "Description=")))
    return norm(a) == norm(b)


def show_diff(old: str | None, new: str, path: Path, tofile: str) -> str:
    return "".join(difflib.unified_diff(
        units.redact_text(old or "").splitlines(keepends=True), units.redact_text(new).splitlines(keepends=True),
        fromfile=f"{path} (now)" if old is not None else "/dev/null", tofile=f"{path} ({tofile})"))


# -- health and smoke --------------------------------------------------------------------------
def endpoint(prod: Production, profile: EngineProfile, port: int) -> tuple[str, ReadinessProbe]:
    probe = ReadinessProbe(health_path=profile.health_path, completion_path=profile.completion_path)
    if not prod.health_url:
        return f"http://127.0.0.1:{port}", probe
    u = urlsplit(prod.health_url)
    return f"{u.scheme}://{u.netloc}", replace(probe, health_path=u.path or profile.health_path)


def wait_healthy(host, unit: str, base_url: str, probe: ReadinessProbe, timeout_s: float,
                 poll_s: float) -> tuple[bool, float, str]:
    """Ready = the unit is up, health answers 200 AND a tiny completion returns text."""
    t0, seen = host.now(), "not polled yet"
    with host.http_client("", timeout=10.0) as http:
        while True:
            state = host.unit(unit, "is-active")
            if state in ("failed", "inactive"):
                return False, host.now() - t0, f"unit {unit} is {state}"
            ok, seen = probe_once(http, base_url, probe, None)
            if ok:
                return True, host.now() - t0, seen
            if host.now() - t0 >= timeout_s:
                return False, host.now() - t0, f"health timeout: not ready within {timeout_s:.0f} s ({seen})"
            host.sleep(poll_s)


def measured_smoke(host, plan: MeasurePlan, profile: EngineProfile) -> Smoke:
    def smoke(base_url: str, depth: int) -> tuple[float | None, dict]:
        p = replace(plan, depths=(depth,), max_model_len=None)
        with host.http_client("", timeout=p.run_timeout_s) as http:
            m = measure_engine(base_url, p, api_from_profile(profile), http=http, clock=host.now)
        d = m.depths[depth]
        return (d.median_decode_tok_s if m.outcome == "measured" else None), {
            "outcome": m.outcome, "reason": m.reason, "median_decode_tok_s": d.median_decode_tok_s,
            "mad_decode_tok_s": d.mad_decode_tok_s}
    return smoke


def smoke_reference(ctx: Context, choice: Choice) -> tuple[int, float, float] | None:
    """(depth, the arm's median decode there, the band below it a smoke may fall)."""
    depths = (choice.end.get("measurement") or {}).get("depths") or {}
    order = [ctx.production.smoke_depth or ctx.plan.depths[0]] + [int(d) for d in depths]
    for d in order:
        rec = depths.get(str(d)) or {}
        if rec.get("median_decode_tok_s"):
            med = rec["median_decode_tok_s"]
            return d, med, max(3 * (rec.get("mad_decode_tok_s") or 0.0), ctx.min_effect * med)
    return None


