"""Re-render the committed reports of the real nights (docs/example-report-llamacpp/,
docs/example-report-vllm/, docs/example-report-vllm-goodput/) from the journals committed beside
them, with today's report code: REPORT.md (its trailer, which says how the night was run, kept)
and report/*.png. A real night cannot be run again the same, but its report is a pure function of
its journal: tests/test_report.py checks that these reports are what their journals render today.

  .venv/bin/python scripts/rerender_examples.py [FOLDER ...]
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

REAL_NIGHTS = ("docs/example-report-llamacpp", "docs/example-report-vllm", "docs/example-report-vllm-goodput")
TRAILER = "\n---\nProduced by "


def split(md: str) -> tuple[str, str]:
    """(the report, the trailer its script appended: from the last ``TRAILER`` on)."""
    i = md.rfind(TRAILER)
    return (md, "") if i < 0 else (md[:i], md[i:])


def staged(folder: Path, into: Path) -> Path:
    """A campaign folder under ``into``, named as the night's was (the report names it), holding
    ``folder``'s journal and boot logs."""
    with open(folder / "journal.jsonl") as f:
        into = into / json.loads(f.readline())["campaign"]["name"]
    into.mkdir(parents=True, exist_ok=True)
    shutil.copy(folder / "journal.jsonl", into / "journal.jsonl")
    for log in folder.glob("arms/*/boot.log"):
        (into / log.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, into / log.relative_to(folder))
    return into


def rerender(folder: Path) -> bool:
    """Write ``folder``'s REPORT.md and report/ anew from its journal; True when REPORT.md changed."""
    from tuner.morning.report import write_report

    old = (folder / "REPORT.md").read_text()
    _, trailer = split(old)
    with tempfile.TemporaryDirectory() as tmp:
        stage = staged(folder, Path(tmp))
        md = write_report(stage)
        shutil.rmtree(folder / "report", ignore_errors=True)
        shutil.copytree(stage / "report", folder / "report")
    new = md + trailer
    (folder / "REPORT.md").write_text(new)
    return new != old


def models() -> None:
    """The model files the reports read (the llama.cpp roofline reads the GGUF's tensors): made
    from their seeds when missing, cached outside the repo."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_moe_gguf.py")], check=True, capture_output=True)


def main(argv: list[str]) -> int:
    os.environ["TZ"] = "UTC"
    time.tzset()
    models()
    for name in argv or REAL_NIGHTS:
        changed = rerender(ROOT / name)
        print(f"{name}: {'re-rendered' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
