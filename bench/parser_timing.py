"""How long the boot-log parser takes on hostile input, per shipped profile.

The daemon parses every arm's boot log in-process, so the parser must be total and bounded:
linear-time regexes, a log over MAX_LOG_CHARS cut to head + tail, a line over MAX_LINE_CHARS
cut to its head. Inputs (the text as the daemon reads it: UTF-8, undecodable bytes replaced):

  1 MB single line   1 MiB of random printable ASCII, no newline
  1 MB buffer line   "CPU_Mapped" x 1 MiB + " model buffer size" (the old quadratic trap)
  1 MB NULs          1 MiB of \\0
  50 MB random       50 MiB of random bytes
  1e6 lines          a real llama-server / vLLM fixture log repeated to 1,000,000 lines

Each must parse within its stated bound (LIMIT_S) to a report; the script exits 1 otherwise.

  .venv/bin/python bench/parser_timing.py [--out bench/results/parser_timing.md]
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from arms.bootlog import MAX_LINE_CHARS, MAX_LOG_CHARS, parse_boot_log  # noqa: E402
from arms.profiles import load_profile  # noqa: E402

MIB = 1 << 20
LIMIT_S = {"1 MB single line": 10.0, "1 MB buffer line": 10.0, "1 MB NULs": 10.0,
           "50 MB random": 60.0, "1e6 lines": 60.0}
FIXTURES = {"llamacpp": REPO / "tests/fixtures/llamacpp_real/boot.log",
            "vllm": REPO / "tests/fixtures/boot_logs/v033_ready.log"}


def inputs(profile: str):
    rnd = random.Random(11)
    yield "1 MB single line", "".join(rnd.choice("abcdefghij klmnopqrstuvwxyz0123456789.,:=()[]{}_-/")
                                      for _ in range(MIB))
    yield "1 MB buffer line", "CPU_Mapped" * (MIB // 10) + " model buffer size"
    yield "1 MB NULs", "\0" * MIB
    yield "50 MB random", os.urandom(50 * MIB).decode("utf-8", "replace")
    fixture = FIXTURES["llamacpp" if profile == "llamacpp" else "vllm"]
    if not fixture.exists():
        raise SystemExit(f"fixture {fixture} is missing")
    lines = fixture.read_text().splitlines()
    yield "1e6 lines", "\n".join(lines[i % len(lines)] for i in range(1_000_000)) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--profiles", default="llamacpp,vllm,vllm-expert-offload")
    ns = ap.parse_args()
    rows = [f"Command: .venv/bin/python bench/parser_timing.py{' --out ' + ns.out if ns.out else ''}",
            "", f"MAX_LOG_CHARS {MAX_LOG_CHARS // MIB} MiB (head + tail kept), MAX_LINE_CHARS "
            f"{MAX_LINE_CHARS // 1024} KiB; each line cut to its head at MAX_LINE_CHARS; one run each.", "",
            "| profile | input | chars in | chars after the log cut | outcome | seconds | limit s |",
            "|---|---|---|---|---|---|---|"]
    failed = []
    for name in ns.profiles.split(","):
        profile = load_profile(name)
        for label, text in inputs(name):
            t0 = time.perf_counter()
            rep = parse_boot_log(text, profile, exit_code=1)
            dt = time.perf_counter() - t0
            limit = LIMIT_S[label]
            if dt > limit:
                failed.append(f"{name} / {label}: {dt:.1f} s > {limit:g} s")
            rows.append(f"| {name} | {label} | {len(text):,} | {len(text) - rep.clipped_chars:,} | "
                        f"{rep.outcome} | {dt:.2f} | {limit:g} |")
            print(rows[-1], flush=True)
    rows += ["", "all within their limits" if not failed else "OVER THE LIMIT: " + "; ".join(failed)]
    text = "\n".join(rows) + "\n"
    print(text)
    if ns.out:
        Path(ns.out).write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
