"""One shape at a time, by hand — `tuner image`, `tuner boot`, `tuner measure` and `tuner check`:
what an operator runs before a night (tuner/cli.py maps each to its command line)."""
from __future__ import annotations

import json
import sys
import logging
import time

from arms.errors import ConfigError

log = logging.getLogger("tuner")


# -- image ---------------------------------------------------------------------------------
def cmd_image(ns) -> int:
    from host.podman_host import PodmanHost

    host = PodmanHost(ns.podman)
    t0 = time.monotonic()
    img = host.simulated_engine_image(rebuild=ns.rebuild)
    print(json.dumps({"ref": img.ref, "tag": img.tag, "built": img.built, "size_bytes": img.size_bytes,
                      "pruned": list(img.pruned), "seconds": round(time.monotonic() - t0, 1)}) if ns.json else img.ref)
    return 0


# -- boot ----------------------------------------------------------------------------------
def _validated(campaign_path: str, change_texts: list[str]):
    """Campaign, profile and the shape to boot, checked on this host alone: nothing is contacted."""
    from arms.profiles import load_profile
    from tuner.night.campaign import check_host, load_campaign, parse_change

    camp = load_campaign(campaign_path)
    profile = load_profile(camp.engine, camp.profile_overrides or None)
    from arms.telemetry import check_telemetry

    check_telemetry(profile, camp.telemetry, camp.baseline, where=f"{camp.path}: key 'measure.telemetry'")
    changes = {}
    for text in change_texts:
        name, value = parse_change(camp, text)
        camp.lever(name)
        changes[name] = value
    shape = camp.baseline
    for name, value in changes.items():
        shape = shape.with_change(name, value)
    check_host(camp, shape, profile.family)
    return camp, profile, shape, changes


def _pinned(host, shape):
    """The shape with its image pinned to the digest podman holds for it."""
    from dataclasses import replace

    info = host.resolve_image(shape.image)
    if info.ref != shape.image:
        log.info("[image] %s resolved to %s", shape.image, info.ref)
    shape = replace(shape, image=info.ref)
    shape.validate_image()
    return shape


def _prepare(campaign_path: str, change_texts: list[str]):
    """Campaign, profile, host and the shape to boot — all checked before anything starts."""
    from host.podman_host import PodmanHost
    from tuner.night.campaign import check_paths

    camp, profile, shape, changes = _validated(campaign_path, change_texts)
    check_paths(shape)                      # creates the compile cache
    host = PodmanHost(camp.podman)
    return camp, profile, host, _pinned(host, shape), changes


def cmd_boot(ns) -> int:
    from arms.boot import boot_arm
    from arms.lifecycle import sweep_orphans
    from tuner.morning.render import boot_table

    camp, profile, host, shape, changes = _prepare(ns.campaign, ns.change)
    sweep_orphans(host, camp.name)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = camp.folder / "boots" / f"{stamp}-{shape.key()}"
    with boot_arm(host, shape, profile, campaign=camp.name, arm=f"boot-{stamp}", folder=folder,
                  changes=changes, limits=camp.boot) as (result, _booted):
        pass
    if ns.json:
        print(json.dumps(result.to_dict(), indent=1, default=str))
    else:
        print(boot_table(result, baseline=camp.baseline, changes=changes))
    return 0 if result.outcome == "ready" else 1


# -- measure -------------------------------------------------------------------------------
def _depths(text: str | None):
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--depths {text!r}: give prompt lengths in tokens, e.g. 166,1087,4064") from None


def _measure_and_print(base_url: str, plan, api, ns, numerics: str = "preserving", http=None, clock=None) -> int:

    from arms import quality
    from arms.measure import format_table, measure_engine
    from arms.sweep import SweepPlan, format_sweep, run_sweep

    m = measure_engine(base_url, plan, api, http=http, **({"clock": clock} if clock else {}))
    q = quality.check(None, m, numerics)
    out = {**m.to_dict(), "quality": q.to_dict()}
    sweep = None
    if ns.sweep:
        sweep = run_sweep(base_url, api, SweepPlan())
        out["sweep"] = sweep.to_dict()
    if ns.json:
        print(json.dumps(out, indent=1, default=str))
    else:
        print(format_table(m))
        print(f"quality: {q.verdict}" + "".join(f"\n  {e}" for e in q.evidence))
        if sweep is not None:
            print(format_sweep(sweep))
    ok = m.outcome == "measured" and q.verdict != "corrupt"
    return 0 if ok else 1


def cmd_measure(ns) -> int:
    from dataclasses import replace

    from arms.measure import MeasurePlan
    from arms.prompts import api_from_profile

    depths = _depths(ns.depths)
    if ns.url:
        from arms.profiles import load_profile

        if ns.campaign:
            raise ConfigError("give either a campaign file or --url, not both")
        profile = load_profile(ns.profile or "vllm")
        plan = MeasurePlan()
        plan = replace(plan, **({"depths": depths} if depths else {}), **({"runs": ns.runs} if ns.runs else {}))
        return _measure_and_print(ns.url.rstrip("/"), plan, api_from_profile(profile), ns)
    if not ns.campaign:
        raise ConfigError("give a campaign file, or --url http://HOST:PORT --profile NAME for a running engine")
    from arms.lifecycle import sweep_orphans
    from tuner.night.arm_runner import ArmRunner
    from tuner.morning.render import arm_report, boot_table
    from tuner.night.verdict import NoiseBand

    camp, profile, host, shape, changes = _prepare(ns.campaign, ns.change)
    plan = camp.measure
    plan = replace(plan, **({"depths": depths} if depths else {}), **({"runs": ns.runs} if ns.runs else {}))
    sweep_orphans(host, camp.name)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = camp.folder / "measures" / f"{stamp}-{shape.key()}"
    runner = ArmRunner.for_campaign(camp, host, profile, plan)
    numerics = "changing" if any(camp.lever(n).numerics == "changing" for n in changes) else "preserving"
    change = next(iter(changes.items())) if len(changes) == 1 else None
    rec = runner.run(0, shape, kind="measure", change=change, numerics=numerics, incumbent=None,
                     incumbent_depths=None, band=NoiseBand(), reference_arm=None, folder=folder)
    rec = runner.sealer.record(rec)                 # secrets sealed, as in the journal
    (folder / "arm.json").write_text(json.dumps(rec, indent=1, default=str))
    if ns.json:
        print(json.dumps(rec, indent=1, default=str))
    else:
        print(boot_table(runner.last_boot, baseline=camp.baseline, changes=changes))
        print()
        print(arm_report(rec))
    ok = rec.get("verdict") == "measured"
    return 0 if ok else 1


# -- campaign: check, run, status -------------------------------------------------------------
EXIT_NOT_PINNED = 4          # `tuner check`: the file is valid; podman did not answer, so the image is not pinned


def _survey(camp) -> str:
    """A shared campaign's database, as ``tuner run`` would open it (a wrong URL, password or
    another campaign of the name: one ``ConfigError`` line, exit 2), read only."""
    from tuner.night.shared import Fleet

    st = camp.storage
    fleet = Fleet(st.url, camp.name, "(tuner check)", grace_s=st.grace_s, heartbeat_s=None, wait_s=st.wait_s)
    try:
        return fleet.connect().survey(camp.identity())
    finally:
        fleet.close()


def cmd_check(ns) -> int:
    """Two steps: everything offline (exit 2 on bad input), then the image pinned to its digest
    by podman; a podman that does not answer is exit 4, never the bad-input code."""
    from dataclasses import replace

    from arms import values
    from tuner.night.search import candidates, propose
    from tuner.night.state import replay

    camp, profile, shape, _ = _validated(ns.campaign, [])
    unpinned = "skipped (--offline)" if ns.offline else None
    if not ns.offline:
        try:
            from host.podman_host import PodmanHost

            host = PodmanHost(camp.podman)
        except (ConfigError, ImportError) as e:      # no service: the file is not at fault
            unpinned = str(e)
        else:
            shape = _pinned(host, shape)
    shared = _survey(camp) if camp.shared and not ns.offline else None
    st = replay([], replace(camp.baseline, image=shape.image))
    if ns.json:
        print(json.dumps({"campaign": camp.name, "valid": True, "pinned": unpinned is None,
                          "levers": len(camp.levers), "profile": profile.name,
                          "folder": str(camp.folder), "image": shape.image, "storage": shared, "objective": str(camp.search.objective),
                          "constraints": camp.search.constraints.describe(),
                          "first_arms": [{"lever": lv, "value": values.text(v), "why": why}
                                         for _, lv, v, why in candidates(st, camp.levers)[: ns.show]]}, indent=1))
    else:
        print(f"campaign {camp.name}: {len(camp.levers)} levers, profile {profile.name}, folder {camp.folder}")
        print(f"image {camp.baseline.image} -> " + (shape.image if unpinned is None else "not pinned"))
        print(f"objective {camp.search.objective}; constraints: {'; '.join(camp.search.constraints.describe()) or 'none'}")
        if shared:
            print(shared)
        first = propose(st, camp.levers)
        print(f"first arm: {first.kind} ({first.why})")
        print("then, one change each, in this order:")
        for i, (_, lever, value, why) in enumerate(candidates(st, camp.levers)[: ns.show], 1):
            print(f"  {i:2d}. {lever} -> {values.text(value)}  ({why})")
    if unpinned is not None and not ns.offline:
        print(f"tuner: {camp.path}: valid, but its image is not pinned to a digest: {unpinned.rstrip('.')}; "
              f"run `tuner check` where podman answers (exit {EXIT_NOT_PINNED}), or --offline to validate only",
              file=sys.stderr)
        return EXIT_NOT_PINNED
    return 0
