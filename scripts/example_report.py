"""The example morning report, docs/example-report/, made from a night the tuner runs here.

``python scripts/example_report.py`` (or ``bash scripts/example-report.sh``) runs
examples/sim-campaign.yaml with ``--simulated`` (host.simhost.SimHost: the simulated engine in
virtual time, no podman; the 12-arm night takes seconds) in ``ROOT``, a fixed folder, so that
the journal is the same on every machine and in every run of the same code. It renders the
report in UTC and copies into docs/example-report/: REPORT.md (with a trailer saying how it was
made), the plots (report/*.png), the journal it was rendered from (journal.jsonl) and the boot
logs the report links; then a screenshot of report.html's first screen (1280 x 900, Debian's
chromium driven headless by playwright, as tests/test_browser.py does): first-screen.png.

tests/test_report.py holds the example to the code: the committed REPORT.md is what the report
renders from the committed journal today, and the committed journal is what a night writes
today (``normalized``: the night's folder and the identities derived from it aside).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "example-report"
ROOT = Path("/tmp/offload-tuner-example")       # the night's folder: fixed, so its journal is too
CAMPAIGN = REPO / "examples" / "sim-campaign.yaml"
TRAILER = "\n---\n"
FIRST_SCREEN = {"width": 1280, "height": 900}


def utc() -> None:
    """Report times in UTC (the report names its zone; the example's must not depend on the host's)."""
    os.environ["TZ"] = "UTC"
    time.tzset()


def run_night(root: Path) -> Path:
    """The campaign's night, simulated, in ``root`` (emptied first); returns the campaign folder."""
    import yaml

    from tuner.cli import main

    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    camp = yaml.safe_load(CAMPAIGN.read_text())
    camp["baseline"]["compile_cache"] = str(root / "compile-cache")
    camp["journal"] = str(root / "journal")
    camp["production"]["unit_file"] = str(root / "units" / "sim-demo.service")
    path = root / "sim-campaign.yaml"
    path.write_text(yaml.safe_dump(camp, sort_keys=False))
    rc = main(["run", str(path), "--simulated", "--quiet"])
    if rc != 0:
        raise SystemExit(f"the example night exited {rc}")
    return root / "journal" / camp["name"]


def linked_logs(md: str) -> list[str]:
    return sorted(set(re.findall(r"\]\((arms/\d+/boot\.log)\)", md)))


def trailer() -> str:
    return (f"{TRAILER}Made by `bash scripts/example-report.sh`: examples/sim-campaign.yaml run with `--simulated` "
            "(the simulated engine on a virtual clock, no podman), the report rendered in UTC from the "
            "`journal.jsonl` beside it; `first-screen.png` is report.html's first screen in headless chromium "
            f"({FIRST_SCREEN['width']} x {FIRST_SCREEN['height']}). tests/test_report.py checks that this report "
            "is what the tuner renders and writes today.\n")


def body(md: str) -> str:
    """A committed REPORT.md without the trailer this script adds."""
    return md.split(TRAILER, 1)[0] if TRAILER in md else md


def normalized(journal: Path, root: Path) -> list[dict]:
    """The journal's records with the night's folder written ``<root>`` and the identities that
    hash it (shape keys, the campaign hash) written ``<id>``: what stays the same wherever the
    night ran."""
    text = journal.read_text().replace(str(root), "<root>")
    text = re.sub(r'"[0-9a-f]{12}"', '"<id>"', text)
    text = re.sub(r'"[0-9a-f]{16}"', '"<id>"', text)
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def screenshot(html: Path, dest: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = b.new_page(viewport=FIRST_SCREEN)
            page.goto(html.as_uri(), wait_until="load")
            page.screenshot(path=str(dest), full_page=False)
        finally:
            b.close()


def main() -> int:
    sys.path.insert(0, str(REPO))
    utc()
    from tuner.morning.report import write_report

    folder = run_night(ROOT)
    md = write_report(folder)
    for old in ("report", "arms"):                # what this script made last time (the browser test's
        shutil.rmtree(OUT / old, ignore_errors=True)   # report-chromium.png and dashboard-chromium.png stay)
    (OUT / "report").mkdir(parents=True)
    (OUT / "REPORT.md").write_text(md + trailer())
    for png in sorted((folder / "report").glob("*.png")):
        shutil.copy(png, OUT / "report" / png.name)
    shutil.copy(folder / "journal.jsonl", OUT / "journal.jsonl")
    for log in linked_logs(md):
        (OUT / log).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(folder / log, OUT / log)
    screenshot(folder / "report.html", OUT / "first-screen.png")
    print(f"{OUT.relative_to(REPO)}: REPORT.md, report/*.png, journal.jsonl, {len(linked_logs(md))} boot log(s), "
          "first-screen.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
