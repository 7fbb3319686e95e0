"""Quality guard: a fast arm whose text is broken is ``corrupt``, whatever its tok/s says.

The reference is the incumbent's temperature-0 ``Measurement`` (its runs keep their text).
A run is compared with the reference's runs of the same prompt (``RunResult.prompt_tag``: one
fixed prompt per depth, or, where the profile defeats the prompt cache with per-run prompts,
the run's own variant, which is the same for every arm).
For an arm, per depth and run that finished its stream (a ``finish_reason`` arrived, valid
or not, so degenerate runs an engine halted are judged too):

* prefix agreement: the share of the reference completion's pieces the arm reproduces before
  the first difference. Pieces are words and punctuation marks split from the text (the same
  split for every arm, whatever the engine's tokenizer), so 1.0 means the same text;
* repetition score: the share of the completion's ``ngram``-grams of pieces that already
  occurred earlier in it (a loop scores near 1, prose near 0);
* early halt: fewer tokens than max_tokens on an engine that ignores EOS, else fewer than
  ``halt_fraction`` of what the reference produced at that depth;
* acceptance jump: spec-decode acceptance against the reference's (evidence only).

The verdict is relative to the incumbent's own output, never to an absolute idea of good text
(a random-weight or small model loops and halts on its own; that is the model, not the arm).
``corrupt`` when the arm degrades against the reference at the same depth:

* diverges where the incumbent was stable: a ``numerics: preserving`` lever changed the text
  while the reference's runs agreed with each other (a reference that varies between runs
  makes divergence evidence only);
* repeats where the incumbent did not: repetition above ``max_repetition`` AND more than
  ``repetition_margin`` above the reference's own score at that depth;
* halts early (above), which on an engine that ignores EOS needs no reference.

Without a reference (the baseline, `tuner measure`) only an early halt on an engine that ignores
EOS is judged; a repetitive text is noted as evidence. The degenerate runs' tok/s stay in the
evidence and in ``degenerate_tok_s``, never as the arm's result. ``unchecked`` when no run
finished.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import ConfigError
from .measure import Measurement, RunResult

NUMERICS = ("preserving", "changing")
_PIECE = re.compile(r"[A-Za-z0-9_']+|[^\sA-Za-z0-9_']")


@dataclass(frozen=True)
class QualityVerdict:
    ok: bool
    verdict: str                          # "ok" | "corrupt" | "unchecked"
    evidence: list[str]
    prefix_agreement: float | None        # worst run against the reference; None: no reference
    repetition_score: float | None        # worst run
    early_halts: int
    acceptance_jump: float | None = None  # arm minus reference acceptance
    degenerate_tok_s: dict[int, float] = field(default_factory=dict)   # evidence, not results

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["degenerate_tok_s"] = {str(k): v for k, v in self.degenerate_tok_s.items()}
        return d


def pieces(text: str) -> list[str]:
    """Words and punctuation marks of ``text``, in order."""
    return _PIECE.findall(text)


def repetition_score(text: str, ngram: int = 4) -> float:
    """Share of the ``ngram``-grams of pieces that already occurred earlier in ``text``."""
    p = pieces(text)
    grams = [tuple(p[i:i + ngram]) for i in range(len(p) - ngram + 1)]
    if not grams:
        return 0.0
    seen: set[tuple[str, ...]] = set()
    repeats = 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams)


def prefix_agreement(reference: str, text: str) -> tuple[float, int]:
    """(share of the reference's pieces reproduced before the first difference, that count)."""
    a, b = pieces(reference), pieces(text)
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return (n / len(a) if a else 1.0 if not b else 0.0), n


def _finished(runs: list[RunResult]) -> list[tuple[int, RunResult]]:
    return [(i, r) for i, r in enumerate(runs, 1) if r.finish_reason is not None]


def _clip(s: str, n: int = 60) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else "..." + s[-n:]


def check(reference: Measurement | None, arm: Measurement, numerics: str, *,
          max_repetition: float = 0.5, ngram: int = 4, halt_fraction: float = 0.75,
          acceptance_jump: float = 0.2, repetition_margin: float = 0.2) -> QualityVerdict:
    """Judge ``arm`` against ``reference`` (None: ``arm`` is the reference; degeneration only)."""
    if numerics not in NUMERICS:
        raise ConfigError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
    evidence: list[str] = []
    failed = False
    agreements: list[float] = []
    reps: list[float] = []
    halts = 0
    degenerate: dict[int, list[float]] = {}
    checked = 0
    for depth, res in arm.depths.items():
        runs = _finished(res.runs)
        ref_runs = _finished(reference.depths[depth].runs) \
            if reference is not None and depth in reference.depths else []
        ref_texts = [r.text for _, r in ref_runs]
        by_prompt: dict[str, list[str]] = {}       # a run compares with the same prompt's runs
        for _, r in ref_runs:
            by_prompt.setdefault(r.prompt_tag, []).append(r.text)
        ref_rep = max((repetition_score(t, ngram) for t in ref_texts), default=None)
        if reference is not None and runs and not ref_texts:
            evidence.append(f"depth {depth}: no reference output to compare with")
        if any(len(set(t)) > 1 for t in by_prompt.values()):
            evidence.append(f"depth {depth}: the reference itself varies between runs")
        if arm.ignores_eos:
            expected, limit = arm.max_tokens, arm.max_tokens
        elif ref_runs and all(r.completion_tokens for _, r in ref_runs):
            expected = min(r.completion_tokens for _, r in ref_runs)
            limit = halt_fraction * expected
        else:
            expected = limit = None
        for i, r in runs:
            checked += 1
            where = f"depth {depth} run {i}"
            bad = False
            rep = repetition_score(r.text, ngram)
            reps.append(rep)
            if rep > max_repetition and ref_rep is not None and rep > ref_rep + repetition_margin:
                bad = True
                evidence.append(f"{where}: repetition loop (score {rep:.2f} > {max_repetition}, the "
                                f"incumbent's {ref_rep:.2f}): {_clip(r.text)!r}")
            elif rep > max_repetition:
                why = "as the incumbent's own text does" if ref_rep is not None else \
                    "no reference to judge it against: the model's own output"
                evidence.append(f"{where}: repetitive text (score {rep:.2f}), {why}")
            short = r.completion_tokens is not None and limit is not None
            if short and r.completion_tokens < limit:
                bad = True
                halts += 1
                evidence.append(f"{where}: early halt at {r.completion_tokens} of {expected} "
                                f"tokens (finish_reason {r.finish_reason})")
            same = by_prompt.get(r.prompt_tag, [])
            ref_stable = len(set(same)) == 1
            if ref_texts and not same:
                evidence.append(f"{where}: no reference run of the same prompt "
                                f"({r.prompt_tag or 'fixed'}) to compare with")
            if same:
                share, n = prefix_agreement(same[0], r.text)
                agreements.append(share)
                if numerics == "preserving" and r.text not in same:
                    failed = failed or ref_stable
                    evidence.append(f"{where}: a numerics-preserving lever changed the text: it "
                                    f"leaves the reference after {n} pieces (agreement "
                                    f"{share:.0%})" + ("" if ref_stable else
                                                       " (evidence only: the reference varies)"))
            if bad:
                failed = True
                if r.decode_tok_s is not None:
                    degenerate.setdefault(depth, []).append(r.decode_tok_s)
    for depth, speeds in degenerate.items():
        evidence.append(f"depth {depth}: degenerate runs decoded at "
                        f"{statistics.median(speeds):.2f} tok/s, kept as evidence, not a result")
    jump = None
    if reference is not None and reference.acceptance is not None and arm.acceptance is not None:
        jump = arm.acceptance - reference.acceptance
        if jump > acceptance_jump:
            evidence.append(f"acceptance jumped {reference.acceptance:.1%} -> {arm.acceptance:.1%}")
    if checked == 0:
        return QualityVerdict(False, "unchecked", evidence + ["no run finished its stream"],
                              None, None, 0, jump)
    return QualityVerdict(not failed, "corrupt" if failed else "ok", evidence,
                          min(agreements) if agreements else None, max(reps), halts, jump,
                          {d: statistics.median(v) for d, v in degenerate.items()})
