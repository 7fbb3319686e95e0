"""What one arm came to: the closed vocabulary of verdicts, and what each one means.

A verdict is journaled as its string (``Verdict`` is a ``StrEnum``: ``Verdict.CORRUPT == "corrupt"``
and ``json.dumps`` writes the plain word), so journals written before this enum read the same.

    better | parity | worse | undecided   a comparison against the incumbent (tuner.night.compare)
    baseline | recheck | measured        the incumbent's own arms and comparison-free measurements
    boot-failed:<class>                  the shape never served (its class from the boot log)
    unstable                             the boot's rate never settled (arms.steady): never better, never worse
    corrupt                              the quality guard fired: the numerics changed the text
    invalid                              the measurement could not be trusted
    interrupted                          the tuner stopped mid-arm (a signal, a crash)
"""
from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    BETTER = "better"
    PARITY = "parity"
    WORSE = "worse"
    UNDECIDED = "undecided"
    BASELINE = "baseline"
    RECHECK = "recheck"
    MEASURED = "measured"
    UNSTABLE = "unstable"
    CORRUPT = "corrupt"
    INVALID = "invalid"
    INTERRUPTED = "interrupted"
    BOOT_FAILED = "boot-failed"          # written with its class: boot_failed("oom") -> "boot-failed:oom"


COMPARED = (Verdict.BETTER, Verdict.PARITY, Verdict.WORSE)        # an objective judged against the incumbent


def boot_failed(failure_class: str) -> str:
    """The verdict of a shape that never served: ``boot-failed:<class>``."""
    return f"{Verdict.BOOT_FAILED}:{failure_class}"


def failure_class(verdict: str | None) -> str | None:
    """``oom`` of ``boot-failed:oom``; None for any other verdict."""
    v = str(verdict or "")
    return v.split(":", 1)[1] if v.startswith(f"{Verdict.BOOT_FAILED}:") else None


def untrusted(verdict: str | None) -> bool:
    """The arm never served a measurement that can be trusted: it failed to boot, was stopped,
    measured nothing usable, or changed the text. Such an arm is never promoted, and Optuna is
    told it failed."""
    v = str(verdict or "")
    return v in (Verdict.INTERRUPTED, Verdict.INVALID, Verdict.CORRUPT) or v.startswith(Verdict.BOOT_FAILED)
