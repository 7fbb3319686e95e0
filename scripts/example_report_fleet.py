"""The example report of a night shared by three boxes (docs/example-report-fleet/, issue 23).

examples/sim-campaign.yaml on the simulated engine's default landscape (seed 002), shared by three
simulated boxes through a private PostgreSQL this script starts (host/pgserver.py, Debian's
postgresql package): box-a at the landscape's own rates, box-b 2.5 % faster, box-c 3 % slower, all
under one simulated clock (tuner/night/simfleet.py). The morning report is rendered from the
shared campaign's folder the way an operator would (`tuner report journal/<name>/`, the password
from PGPASSWORD), and copied with the shared journal (the database's `tuner_records`, one JSON
line each, gzipped) and the boot log of each failure it links.

  .venv/bin/python scripts/example_report_fleet.py [--hours 3] [--seed 0] [--out docs/example-report-fleet]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from host.pgserver import PgServer  # noqa: E402
from simengine.landscape import DEFAULT_LANDSCAPE  # noqa: E402
from tuner.night.simfleet import run_fleet  # noqa: E402

BOXES = {"box-a": 1.0, "box-b": 1.025, "box-c": 0.97}
NAME = "fleet-example"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "docs" / "example-report-fleet"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-example-"))
    raw = yaml.safe_load((REPO / "examples" / "sim-campaign.yaml").read_text())
    raw.pop("production", None)
    raw.update(name=NAME, journal=str(tmp / "journal"), budget={"hours": args.hours})
    raw["baseline"]["compile_cache"] = str(tmp / "compile-cache")
    path = tmp / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    t0 = time.monotonic()
    with PgServer(Path(tempfile.mkdtemp(prefix="fleet-example-pg-", dir="/tmp"))) as pg:
        runs = run_fleet(path, pg.url, BOXES, landscape=DEFAULT_LANDSCAPE, seed=args.seed, hours=args.hours)
        bad = {b: r.error for b, r in runs.items() if r.error is not None}
        if bad:
            print(f"a box stopped: {bad}", file=sys.stderr)
            return 1
        folder = tmp / "journal" / NAME
        env = {**os.environ, "PGPASSWORD": pg.password, "TZ": "UTC", "PYTHONPATH": str(REPO)}
        subprocess.run([sys.executable, "-m", "tuner.cli", "report", str(folder)], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        import psycopg2

        with psycopg2.connect(pg.url) as conn, conn.cursor() as cur:
            cur.execute("SELECT line FROM tuner_records WHERE campaign = %s ORDER BY seq", (NAME,))
            lines = [line for (line,) in cur.fetchall()]
    wall = time.monotonic() - t0
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    md = (folder / "REPORT.md").read_text()
    shutil.copytree(folder / "report", out / "report")
    text = "\n".join(lines) + "\n"
    with gzip.open(out / "journal.jsonl.gz", "wt", compresslevel=9) as f:     # 1.9 MB as text
        f.write(text.replace(str(tmp) + "/", ""))                             # no path of this machine
    for log in sorted(set(re.findall(r"[\w-]+/arms/\d+/boot\.log", md))):
        if (folder / log).exists():
            (out / log).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(folder / log, out / log)
    starts = [json.loads(x) for x in lines if '"op": "arm_start"' in x or '"op":"arm_start"' in x]
    md = md.replace(str(tmp) + "/", "")
    md += ("\n---\nProduced by `.venv/bin/python scripts/example_report_fleet.py --hours "
           f"{args.hours:g} --seed {args.seed}`: examples/sim-campaign.yaml on the simulated engine's default "
           f"landscape, shared by {len(BOXES)} simulated boxes ({', '.join(f'{b} x{f:g}' for b, f in BOXES.items())}) "
           f"through a private PostgreSQL, {len(starts)} arms on a budget of {args.hours:g} simulated hours "
           f"({wall:.0f} s of wall time on a {os.cpu_count()}-core machine). The shared journal "
           "(the database's tuner_records) is journal.jsonl.gz.\n")
    (out / "REPORT.md").write_text(md)
    print(f"{out}: {len(starts)} arms, {wall:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
