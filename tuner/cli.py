"""`tuner` command line: thin over the library; every TunerError becomes one stderr line.

Exit codes: 0 success, 1 the thing ran and failed (a boot that did not come up), 2 bad input
(nothing was started), 3 `tuner run`: the night ran and learned nothing ("no result": its
starting shape never yielded the objective; tuner/night/ending.py), 4 `tuner check` found the
campaign valid but podman did not answer, so its image tag is not pinned to a digest
(``--offline`` skips that step and exits 0).
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys

from arms.errors import ConfigError, TunerError
from tuner.oneshot import EXIT_NOT_PINNED, cmd_boot, cmd_check, cmd_image, cmd_measure  # noqa: F401 - the commands; the code tests read

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


def cmd_schema(ns) -> int:
    from tuner.night.schema import json_schema

    print(json.dumps(json_schema(), indent=1, sort_keys=True))
    return 0


def cmd_run(ns) -> int:
    from tuner.daemon import run_campaign

    return run_campaign(ns)


def cmd_status(ns) -> int:
    from tuner.morning.status import print_status

    return print_status(ns)


# -- report, export, dashboard ---------------------------------------------------------------
def cmd_report(ns) -> int:
    from tuner.morning.report import write_report

    md = write_report(ns.campaign)
    if ns.json:
        from tuner.night.readback import folder_of

        folder = folder_of(ns.campaign)
        print(json.dumps({"folder": str(folder), "markdown": str(folder / "REPORT.md"),
                          "html": str(folder / "report.html"),
                          "plots": sorted(str(p) for p in (folder / "report").glob("*.png"))}, indent=1))
    else:
        print(md, end="")
    return 0


def cmd_export(ns) -> int:
    from tuner.morning.export import export

    path = export(ns.campaign, ns.format, ns.output)
    print(json.dumps({"path": str(path), "format": ns.format}) if ns.json else path)
    return 0


def cmd_dashboard(ns) -> int:
    from tuner.morning.dashboard import serve

    serve(ns.campaign, ns.port)
    return 0


# -- production: promote, rollback; init -------------------------------------------------------
def cmd_promote(ns) -> int:
    from tuner.night.readback import folder_of
    from tuner.production.promote import promote

    res = promote(folder_of(ns.campaign), ns.arm, dry_run=ns.dry_run, force=ns.force, margin_s=ns.margin_s,
                  write_only=ns.write_only, allow_simulated=ns.allow_simulated,
                  **({"out": lambda _line: None} if ns.json else {}))
    if ns.json:
        from dataclasses import asdict

        print(json.dumps(asdict(res), indent=1, default=str))
    return 1 if res.outcome == "rolled-back" else 0


def cmd_rollback(ns) -> int:
    from tuner.night.readback import folder_of
    from tuner.production.promote import rollback

    res = rollback(folder_of(ns.campaign), force=ns.force, write_only=ns.write_only, **({"out": lambda _line: None} if ns.json else {}))
    if ns.json:
        from dataclasses import asdict

        print(json.dumps(asdict(res), indent=1, default=str))
    return 0 if res.healthy else 1


def cmd_init(ns) -> int:
    from tuner.production.init import init_from_container

    path = init_from_container(ns.from_container, ns.output, podman=ns.podman, force=ns.force)
    print(json.dumps({"path": str(path)}) if ns.json else
          f"wrote {path}: `tuner check {path}` validates it and lists the first arms")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tuner", description="offload-tuner: find the engine shape that decodes fastest")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def add(name: str, help: str, **kw):            # the help line is also the command's description
        return sub.add_parser(name, help=help, description=kw.pop("description", help[0].upper() + help[1:] + "."), **kw)

    s = add("image", "build (or find) the simulated engine's image; print its digest reference")
    s.add_argument("--podman", default=None, help="podman API socket (default: CONTAINER_HOST)")
    s.add_argument("--rebuild", action="store_true")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_image)

    s = add("boot", "boot one shape of a campaign, print its boot report, tear down")
    s.add_argument("campaign", help="campaign YAML file")
    s.add_argument("--change", action="append", default=[], metavar="LEVER=VALUE",
                   help="change one lever of the baseline (repeatable)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_boot)

    s = add("measure", "boot a shape and measure decode at exact depths (or measure a running engine)")
    s.add_argument("campaign", nargs="?", help="campaign YAML file")
    s.add_argument("--change", action="append", default=[], metavar="LEVER=VALUE")
    s.add_argument("--url", help="measure an engine that is already running, e.g. http://127.0.0.1:8000")
    s.add_argument("--profile", help="engine profile for --url (vllm, vllm-expert-offload, llamacpp, simengine)")
    s.add_argument("--depths", help="comma-separated prompt lengths in tokens (default 166,1087,4064)")
    s.add_argument("--runs", type=int, help="measured runs per depth (default 3)")
    s.add_argument("--sweep", action="store_true", help="also run the concurrency sweep (goodput at the SLO)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_measure)

    s = add("check", "validate a campaign, pin its image digest, print the arms it would run first",
            description="Validate a campaign on this host alone (exit 2 on bad input: one FILE:LINE: KEY line "
                        "per error), then pin its image tag to a digest through podman (exit 4 when podman "
                        "does not answer: the file is valid, the image not pinned), then print the first arms.")
    s.add_argument("campaign")
    s.add_argument("--offline", action="store_true", help="validate only: do not ask podman for the image digest")
    s.add_argument("--show", type=int, default=12, help="how many first arms to list")
    s.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    s.set_defaults(fn=cmd_check)

    s = add("schema", "print the campaign file's JSON Schema (for editors)",
                       description="Print the JSON Schema of a campaign file, for editor completion and checks "
                                   "(docs/campaign.schema.json is this output).")
    s.set_defaults(fn=cmd_schema)

    s = add("run", "run a campaign until its deadline or arm budget (resumes after a crash)")
    s.add_argument("campaign")
    s.add_argument("--max-arms", type=int, default=None, help="stop after this many arms in all")
    s.add_argument("--force-resume", action="store_true", help="continue a folder written by a different campaign file")
    s.add_argument("--detach", action="store_true", help="run in the background; output goes to the campaign folder")
    s.add_argument("--simulated", action="store_true",
                   help="run against the landscape in simulated time (no podman): a night in seconds")
    s.add_argument("--quiet", action="store_true", help="no live table, log lines only")
    s.add_argument("--box", default=None, help="a shared campaign (storage:): this box's name among the boxes "
                                               "that run it (default: the host name)")
    s.add_argument("--port", type=int, default=None, help="serve this box's arms on this port instead of "
                                                          "baseline.port (several boxes on one machine)")
    s.set_defaults(fn=cmd_run)

    s = add("status", "what a campaign has done and what is running")
    s.add_argument("campaign", help="campaign YAML file or campaign folder")
    s.add_argument("--wide", action="store_true", help="every column (boot seconds, reasons), however wide")
    s.add_argument("--json", action="store_true", help="everything as JSON: arms, objective, deadline, phase")
    s.set_defaults(fn=cmd_status)

    s = add("report", "the morning report: REPORT.md and report.html in the campaign folder")
    s.add_argument("campaign", help="campaign folder (journal/<name>) or campaign YAML file")
    s.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    s.set_defaults(fn=cmd_report)

    s = add("export", "one flat row per arm as CSV, JSON lines or Parquet")
    s.add_argument("campaign", help="campaign folder (journal/<name>) or campaign YAML file")
    s.add_argument("--format", choices=("csv", "jsonl", "parquet"), default="csv")
    s.add_argument("-o", "--output", default=None, help="file to write (default: arms.FORMAT in the campaign folder)")
    s.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    s.set_defaults(fn=cmd_export)

    s = add("dashboard", "optuna-dashboard on the campaign's study, bound to 127.0.0.1")
    s.add_argument("campaign", help="campaign folder (journal/<name>) or campaign YAML file")
    s.add_argument("--port", type=int, default=8080)
    s.set_defaults(fn=cmd_dashboard)

    s = add("promote", "write a campaign's winner to the production service; roll back if it "
                                       "fails, times out or decodes slower than measured")
    s.add_argument("campaign", help="campaign folder (or its YAML file)")
    s.add_argument("--arm", type=int, default=None, help="promote this arm instead of the final incumbent")
    s.add_argument("--dry-run", action="store_true", help="show the diff of the production file and stop")
    s.add_argument("--force", action="store_true",
                   help="promote an arm that was not better-and-confirmed; continue after an interrupted promotion")
    s.add_argument("--write-only", action="store_true",
                   help="write (and back up) the unit file only: no daemon-reload, restart or health check "
                        "(a machine without systemd, or to apply it yourself)")
    s.add_argument("--margin-s", type=float, default=None,
                   help="seconds of health wait beyond the arm's measured boot (default max(60, boot/2))")
    s.add_argument("--allow-simulated", action="store_true",
                   help="promote a night run with --simulated (refused without it; promoted with a warning)")
    s.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    s.set_defaults(fn=cmd_promote)

    s = add("rollback", "restore the production file the latest promotion replaced; reload, restart")
    s.add_argument("campaign", help="campaign folder (or its YAML file)")
    s.add_argument("--force", action="store_true", help="restore even if the production file was edited since")
    s.add_argument("--write-only", action="store_true", help="restore the file only: no daemon-reload or restart")
    s.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    s.set_defaults(fn=cmd_rollback)

    s = add("init", "write a campaign whose baseline is a running container's shape")
    s.add_argument("--from-container", required=True, metavar="NAME", help="name or id of a running container")
    s.add_argument("-o", "--output", default=None, help="campaign file to write (default NAME.yaml)")
    s.add_argument("--podman", default=None, help="podman API socket (default: CONTAINER_HOST)")
    s.add_argument("--force", action="store_true", help="overwrite the output file")
    s.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    s.set_defaults(fn=cmd_init)

    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("offload-tuner")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    _setup_logging(ns.verbose)
    _sigterm_as_exit()
    try:
        return ns.fn(ns)
    except TunerError as e:
        for line in str(e).splitlines() or [""]:     # a campaign's errors: one line each
            print(f"tuner: error: {line}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("tuner: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:                  # `tuner status X | head -1`: the reader has all it wanted
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())    # so the interpreter's final flush does not fail too
        return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main", "build_parser", "ConfigError"]
