"""Real engine boot logs from public issue threads, one fixture per case.

Each ``tests/fixtures/boot_logs/real/<engine>/<case>.log`` starts with ``#`` comment lines
citing its source (repository, issue or pull request URL, engine version); the rest is the
engine's own lines, verbatim, trimmed to start-up and the failure. ``expected.yaml`` in that
directory holds, per fixture, the profile to parse it with, the expected outcome (a failure
class, or ``ready``), a substring the deciding evidence must contain, and for a successful boot
the memory-plan fields the log must yield. These logs were not written against the profiles:
they are what vLLM 0.4 -> 0.11 (and its NIM / Ascend / ROCm / V100 forks), SGLang and
llama.cpp builds from 2023 to 2026 print.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from arms.bootlog import parse_boot_log
from arms.profiles import CLASSES, load_profile

REAL = Path(__file__).parent / "fixtures" / "boot_logs" / "real"
TABLE: dict = yaml.safe_load((REAL / "expected.yaml").read_text(encoding="utf-8"))


def _log(name: str) -> tuple[list[str], str]:
    """(the leading comment lines, the log text after them)."""
    lines = (REAL / name).read_bytes().decode("utf-8").split("\n")
    header = []
    while lines and lines[0].startswith("#"):
        header.append(lines.pop(0))
    return header, "\n".join(lines)


def _parse(name: str):
    case = TABLE[name]
    ready = case["class"] == "ready"
    exit_code = case.get("exit_code", None if ready else 1)
    return parse_boot_log(_log(name)[1], load_profile(case["profile"]), exit_code=exit_code)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_real_log_outcome_and_evidence(name: str) -> None:
    case = TABLE[name]
    report = _parse(name)
    assert report.outcome == case["class"], (report.outcome, report.evidence)
    assert any(case["evidence"] in line for line in report.evidence), (case["evidence"], report.evidence)
    for key, want in (case.get("fields") or {}).items():
        assert getattr(report, key) == want, (key, getattr(report, key))


def test_every_real_log_has_one_expectation() -> None:
    logs = {str(p.relative_to(REAL)) for p in REAL.rglob("*.log")}
    assert logs == set(TABLE), (sorted(logs - set(TABLE)), sorted(set(TABLE) - logs))


@pytest.mark.parametrize("name", sorted(TABLE))
def test_real_log_cites_its_source(name: str) -> None:
    header, body = _log(name)
    source = [line for line in header if line.startswith("# source:")]
    assert source and "https://github.com/" in source[0], header
    assert any(line.startswith("# engine:") for line in header), header
    assert body.strip(), "no log lines after the header"
    assert TABLE[name]["class"] in CLASSES | {"ready"}


def test_real_logs_span_engines_and_classes() -> None:
    engines = {name.split("/")[0] for name in TABLE}
    assert {"vllm", "vllm-ascend", "vllm-rocm", "sglang", "llamacpp"} <= engines, engines
    assert len(TABLE) >= 20
    classes = {case["class"] for case in TABLE.values()}
    assert {"ready", "oom", "kv-too-small", "bad-argument", "unsupported", "port-in-use"} <= classes
