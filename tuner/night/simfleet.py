"""A simulated fleet: N boxes of the simulated engine sharing one campaign through a real
PostgreSQL, in one process, under one virtual time. Each box is its own ``SimHost`` (its own
noise stream, its own offset: every rate of its landscape times the box's factor) running its own
``CampaignLoop`` in a thread; ``shared.Turns`` lets the box whose virtual clock reads earliest
take the shared record, so the night is a discrete-event one and its result does not depend on
which thread the machine ran first. What the bench (bench/fleet.py) and the tests run."""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import yaml

from arms.profiles import load_profile
from tuner.night.campaign import load_campaign
from tuner.night.loop import CampaignLoop, Summary
from tuner.night.schema import Storage
from tuner.night.shared import Fleet, Turns

log = logging.getLogger("tuner.simfleet")


@dataclass
class BoxRun:
    box: str
    factor: float
    summary: Summary | None = None
    error: BaseException | None = None
    hours: float = 0.0                 # the box's virtual clock at its end


def box_landscape(base: Path, factor: float, folder: Path) -> Path:
    """``base`` with every rate times ``factor`` from the start of the night (a drift step at
    hour 0, next to any the landscape has): one box's offset."""
    d = yaml.safe_load(Path(base).read_text()) or {}
    if factor != 1.0:
        steps = d.get("drift_step")
        steps = [] if steps is None else (steps if isinstance(steps, list) else [steps])
        d["drift_step"] = [{"at_hours": 0, "factor": float(factor)}, *steps]
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / Path(base).name
    out.write_text(yaml.safe_dump(d, sort_keys=False))
    return out


def run_fleet(campaign: Path, url: str, boxes: dict[str, float], *, landscape: Path, seed: int = 0,
              hours: float | None = None, max_arms: int | None = None,
              on_arm: Callable[[str, object, dict], None] | None = None) -> dict[str, BoxRun]:
    """One simulated night of ``boxes`` (name -> rate factor) on the campaign file ``campaign``
    shared through ``url``; returns each box's run. ``on_arm(box, state, end)`` after each arm."""
    from host.simhost import SimHost

    base = load_campaign(str(campaign))
    base = replace(base, storage=Storage(url=url))
    profile = load_profile(base.engine, base.profile_overrides or None)
    turns = Turns(list(boxes))
    runs = {b: BoxRun(b, f) for b, f in boxes.items()}

    def one(i: int, box: str) -> None:
        run = runs[box]
        fleet = host = None
        try:
            land = box_landscape(landscape, run.factor, base.folder.parent / f".landscapes-{base.name}" / box)
            camp = base.for_box(box)
            camp, host = SimHost.pinned(camp, landscape=str(land), noise_seed=seed * 1000 + i)
            fleet = Fleet(url, camp.name, box, clock=host.wall, turns=turns, grace_s=None)
            fleet.connect()
            fleet.join(camp.identity(), {"host": "simulated"})
            loop = CampaignLoop(camp, host, profile, fleet=fleet, max_arms=max_arms,
                                deadline=None if hours is None else host.now() + hours * 3600,
                                on_arm=(lambda st, end: on_arm(box, st, end)) if on_arm else None)
            run.summary = loop.run()
            run.hours = host.now() / 3600
        except BaseException as e:   # noqa: BLE001 - reported per box; the others go on
            log.error("[box %s] stopped: %s", box, e)
            run.error = e
        finally:
            if fleet is not None:
                fleet.leave()
                fleet.close()
            else:
                turns.leave(box)
            if host is not None:
                host.close()

    threads = [threading.Thread(target=one, args=(i, b), name=f"box {b}") for i, b in enumerate(boxes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return runs
