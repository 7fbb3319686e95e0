"""`tuner demo`: the simulated engine end to end — image by digest, boot, measure, tear down."""
from __future__ import annotations

import logging
import time
from pathlib import Path

log = logging.getLogger("tuner.demo")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sim-campaign.yaml"


def run_demo(ns) -> int:
    from arms.boot import BootLimits, boot_arm
    from arms.lifecycle import sweep_orphans
    from arms.measure import MeasurePlan, format_table, measure_engine
    from arms.prompts import api_from_profile
    from host.simimage import ensure_image
    from tuner.cli import _prepare
    from tuner.render import boot_table

    camp_path = getattr(ns, "campaign", None) or str(EXAMPLE)
    from host.podman_host import PodmanHost

    ensure_image(PodmanHost(ns.podman).client)
    camp, profile, host, shape, _ = _prepare(camp_path, [])
    sweep_orphans(host, camp.name)
    folder = camp.folder / "demo" / time.strftime("%Y%m%d-%H%M%S")
    limits = BootLimits(camp.boot.timeout_s, camp.boot.hang_s, camp.boot.poll_s)
    plan = MeasurePlan(depths=(166, 1087), runs=1, warm_tokens=16, max_tokens=64)
    with boot_arm(host, shape, profile, campaign=camp.name, arm="demo", folder=folder,
                  limits=limits) as (result, b):
        print(boot_table(result, baseline=camp.baseline))
        if not result.ready:
            return 1
        with host.http_client(b.cid, timeout=plan.run_timeout_s) as http:
            m = measure_engine(b.base_url, plan, api_from_profile(profile), http=http, clock=host.now)
    print()
    print(format_table(m))
    (folder / "measure.json").write_text(__import__("json").dumps(m.to_dict(), indent=1))
    print(f"\nartifacts: {folder}")
    return 0 if m.outcome == "measured" else 1
