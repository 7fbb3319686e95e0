"""`tuner` command line: thin over the library; every TunerError becomes one stderr line.

Exit codes: 0 success, 1 the thing ran and failed (a boot that did not come up), 2 bad input
(nothing was started).
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from pathlib import Path

from arms.errors import ConfigError, TunerError

log = logging.getLogger("tuner")


def _sigterm_as_exit() -> None:
    """SIGTERM unwinds like Ctrl-C, so every context manager tears its container down."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, handler)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("urllib3", "httpx", "httpcore", "podman"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


# -- image ---------------------------------------------------------------------------------
def cmd_image(ns) -> int:
    from host.podman_host import PodmanHost
    from host.simimage import ensure_image

    host = PodmanHost(ns.podman)
    t0 = time.monotonic()
    img = ensure_image(host.client, rebuild=ns.rebuild)
    print(json.dumps({"ref": img.ref, "tag": img.tag, "built": img.built, "size_bytes": img.size_bytes,
                      "seconds": round(time.monotonic() - t0, 1)}) if ns.json else img.ref)
    return 0


# -- boot ----------------------------------------------------------------------------------
def _prepare(campaign_path: str, change_texts: list[str]):
    """Campaign, profile, host and the shape to boot — all checked before anything starts."""
    from arms.profiles import load_profile
    from arms.shape import parse_change
    from host.podman_host import PodmanHost
    from tuner.campaign import check_paths, load_campaign

    camp = load_campaign(campaign_path)
    profile = load_profile(camp.engine, camp.profile_overrides or None)
    changes = {}
    for text in change_texts:
        name, value = parse_change(text, camp.levers)
        camp.lever(name)
        changes[name] = value
    shape = camp.baseline
    for name, value in changes.items():
        shape = shape.with_change(name, value)
    check_paths(shape)
    host = PodmanHost(camp.podman)
    info = host.resolve_image(shape.image)
    if info.ref != shape.image:
        log.info("[image] %s resolved to %s", shape.image, info.ref)
    from dataclasses import replace

    shape = replace(shape, image=info.ref)
    shape.validate_image()
    return camp, profile, host, shape, changes


def cmd_boot(ns) -> int:
    from arms.boot import BootLimits, boot_arm
    from arms.lifecycle import sweep_orphans
    from tuner.render import boot_table

    camp, profile, host, shape, changes = _prepare(ns.campaign, ns.change)
    sweep_orphans(host, camp.name)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = camp.folder / "boots" / f"{stamp}-{shape.key()}"
    limits = BootLimits(camp.boot.timeout_s, camp.boot.hang_s, camp.boot.poll_s)
    with boot_arm(host, shape, profile, campaign=camp.name, arm=f"boot-{stamp}", folder=folder,
                  changes=changes, limits=limits) as (result, _booted):
        pass
    if ns.json:
        print(json.dumps(result.to_dict(), indent=1, default=str))
    else:
        print(boot_table(result, baseline=camp.baseline, changes=changes))
    return 0 if result.outcome == "ready" else 1


# -- demo ----------------------------------------------------------------------------------
def cmd_demo(ns) -> int:
    from tuner.demo import run_demo

    return run_demo(ns)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tuner", description="offload-tuner: find the engine shape that decodes fastest")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("image", help="build (or find) the simulated engine's image; print its digest reference")
    s.add_argument("--podman", default=None, help="podman API socket (default: CONTAINER_HOST)")
    s.add_argument("--rebuild", action="store_true")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_image)

    s = sub.add_parser("boot", help="boot one shape of a campaign, print its boot report, tear down")
    s.add_argument("campaign", help="campaign YAML file")
    s.add_argument("--change", action="append", default=[], metavar="LEVER=VALUE",
                   help="change one lever of the baseline (repeatable)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_boot)

    s = sub.add_parser("demo", help="boot the simulated engine in podman by digest and measure one completion")
    s.add_argument("--podman", default=None)
    s.add_argument("--folder", default="journal/demo")
    s.set_defaults(fn=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    _setup_logging(ns.verbose)
    _sigterm_as_exit()
    try:
        return ns.fn(ns)
    except TunerError as e:
        print(f"tuner: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("tuner: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main", "build_parser", "ConfigError"]
