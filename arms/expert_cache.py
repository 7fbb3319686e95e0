"""Expert-cache telemetry files: the pure parse of ``expert_cache_rank<N>.json`` (seed 002).

With ``R4D_LRU_TELEMETRY=1`` the expert-offload fork counts, per layer, what its expert cache
did during a torch-profiler window and writes one file per rank (``arms.telemetry`` runs the
window and copies the files out). Counters per layer: routed = hits + installs + read_through;
``served_by_prefetch`` is the part of the hits that a prefetched slab served. Prefetch
precision = served_by_prefetch / prefetched; every other prefetched slab was a useless copy,
and useless x slab size / steps is the waste per decode step and rank.

``report_from_texts`` is pure ({file name: content} -> ``TelemetryReport``); ``load_report``
reads a folder. A truncated or unreadable file and a missing rank are reported, never raised.
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

COUNTERS = ("routed", "hits", "installs", "read_through", "prefetched", "served_by_prefetch")
_ALIASES = {"read-through": "read_through", "readthrough": "read_through",
            "host_installs": "installs", "migrations": "served_by_prefetch",
            "prefetch_served": "served_by_prefetch", "served": "served_by_prefetch"}
FILE_RE = re.compile(r"expert_cache_rank(\d+)\.json$")
GB, MIB = 1e9, 1024 * 1024


@dataclass(frozen=True)
class Counts:
    routed: int = 0
    hits: int = 0
    installs: int = 0
    read_through: int = 0
    prefetched: int = 0
    served_by_prefetch: int = 0

    def __add__(self, o: Counts) -> Counts:
        return Counts(*(getattr(self, c) + getattr(o, c) for c in COUNTERS))

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.routed if self.routed else None

    @property
    def precision(self) -> float | None:
        return self.served_by_prefetch / self.prefetched if self.prefetched else None

    @property
    def useless(self) -> int:
        return max(0, self.prefetched - self.served_by_prefetch)

    @property
    def moved(self) -> int:
        """Slabs copied host -> device: installs + read-through + prefetched."""
        return self.installs + self.read_through + self.prefetched


def _counts(d: Mapping) -> Counts:
    vals = {_ALIASES.get(str(k), str(k)): v for k, v in d.items()}
    return Counts(*(int(vals.get(c) or 0) for c in COUNTERS))


@dataclass(frozen=True)
class LayerStats:
    layer: int
    kind: str                    # "resident" (VRAM-only, pinned) | "swap" (host-backed)
    counts: Counts


@dataclass(frozen=True)
class RankStats:
    rank: int
    steps: int | None
    slab_bytes: int | None
    totals: Counts
    layers: tuple[LayerStats, ...] = ()
    source: str = ""

    def per_step(self, n: float) -> float | None:
        return n / self.steps if self.steps else None

    @property
    def wasted_bytes_per_step(self) -> float | None:
        w = self.per_step(self.totals.useless)
        return w * self.slab_bytes if w is not None and self.slab_bytes else None

    @property
    def gather_bytes_per_step(self) -> float | None:
        m = self.per_step(self.totals.moved)
        return m * self.slab_bytes if m is not None and self.slab_bytes else None

    def kind(self, kind: str) -> list[LayerStats]:
        return [x for x in self.layers if x.kind == kind]

    def to_dict(self) -> dict:
        t = self.totals
        return {"rank": self.rank, "steps": self.steps, "slab_bytes": self.slab_bytes,
                "source": self.source, "totals": asdict(t), "hit_rate": t.hit_rate,
                "precision": t.precision, "useless": t.useless, "moved": t.moved,
                "wasted_bytes_per_step": self.wasted_bytes_per_step,
                "gather_bytes_per_step": self.gather_bytes_per_step,
                "resident_layers": [x.layer for x in self.kind("resident")],
                "swap_layers": [x.layer for x in self.kind("swap")],
                "layers": [{"layer": x.layer, "kind": x.kind, **asdict(x.counts),
                            "hit_rate": x.counts.hit_rate, "precision": x.counts.precision}
                           for x in self.layers]}


def parse_rank(text: str | bytes, name: str, slab_bytes: int | None = None) -> RankStats:
    """One ``expert_cache_rank<N>.json``; ValueError (one line) when it cannot be used."""
    raw = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    try:
        d = json.loads(raw)
    except json.JSONDecodeError as e:
        body = raw.strip()
        what = "is empty" if not body else "is not valid JSON" if body.endswith("}") else "is truncated"
        raise ValueError(f"{name} {what} ({e.msg} at byte {e.pos:,} of {len(raw):,})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{name}: expected a JSON object, got {type(d).__name__}")
    m = FILE_RE.search(name)
    rank = int(d.get("rank", m.group(1) if m else 0))
    layers = []
    for i, x in enumerate(d.get("layers") or []):
        c = _counts(x)
        kind = x.get("kind") or ("resident" if c.hits == c.routed and not c.moved else "swap")
        layers.append(LayerStats(int(x.get("layer", i)), str(kind), c))
    if layers:
        totals = Counts()
        for x in layers:
            totals = totals + x.counts
    elif isinstance(d.get("totals"), dict):
        totals = _counts(d["totals"])
    else:
        raise ValueError(f"{name}: neither 'layers' nor 'totals' holds counters")
    steps = d.get("steps")
    slab = d.get("slab_bytes") or slab_bytes
    return RankStats(rank, int(steps) if steps else None, int(slab) if slab else None, totals,
                     tuple(layers), name)


def _layer_range(xs: list[int]) -> str:
    if not xs:
        return "none"
    return f"{xs[0]}-{xs[-1]}" if xs == list(range(xs[0], xs[-1] + 1)) and len(xs) > 1 else \
        ", ".join(map(str, xs)) if len(xs) < 6 else f"{len(xs)} layers"


def _pct(x: float | None, nd: int = 0) -> str:
    return "n/a" if x is None else f"{x * 100:.{nd}f} %"


@dataclass
class TelemetryReport:
    ranks: dict[int, RankStats]
    expected_ranks: tuple[int, ...] = ()
    missing_ranks: tuple[int, ...] = ()
    problems: list[str] = field(default_factory=list)

    @property
    def totals(self) -> Counts:
        t = Counts()
        for r in self.ranks.values():
            t = t + r.totals
        return t

    def _mean(self, attr: str) -> float | None:
        vals = [getattr(r, attr) for r in self.ranks.values()]
        vals = [v for v in vals if v is not None]
        return statistics.fmean(vals) if vals else None

    @property
    def wasted_gb_per_step_per_rank(self) -> float | None:
        w = self._mean("wasted_bytes_per_step")
        return None if w is None else w / GB

    @property
    def gather_gb_per_step_per_rank(self) -> float | None:
        g = self._mean("gather_bytes_per_step")
        return None if g is None else g / GB

    @property
    def moved_slabs_per_step_per_rank(self) -> float | None:
        vals = [r.per_step(r.totals.moved) for r in self.ranks.values()]
        vals = [v for v in vals if v is not None]
        return statistics.fmean(vals) if vals else None

    @property
    def slab_bytes(self) -> int | None:
        return next((r.slab_bytes for r in self.ranks.values() if r.slab_bytes), None)

    @property
    def prefetch_on(self) -> bool:
        return self.totals.prefetched > 0

    def summary(self) -> dict:
        t = self.totals
        return {"ranks": sorted(self.ranks), "steps": {r: s.steps for r, s in self.ranks.items()},
                "slab_bytes": self.slab_bytes, "hit_rate": t.hit_rate, "precision": t.precision,
                "prefetched": t.prefetched, "served_by_prefetch": t.served_by_prefetch,
                "useless": t.useless, "useless_share_of_gather": t.useless / t.moved if t.moved else None,
                "wasted_gb_per_step_per_rank": self.wasted_gb_per_step_per_rank,
                "gather_gb_per_step_per_rank": self.gather_gb_per_step_per_rank,
                "moved_slabs_per_step_per_rank": self.moved_slabs_per_step_per_rank}

    def to_dict(self) -> dict:
        return {"summary": self.summary(), "expected_ranks": list(self.expected_ranks),
                "missing_ranks": list(self.missing_ranks), "problems": list(self.problems),
                "findings": self.findings(),
                "ranks": {str(r): s.to_dict() for r, s in sorted(self.ranks.items())}}

    def findings(self) -> list[str]:
        """Seed-002-style sentences, headline first; problems last."""
        out: list[str] = []
        if not self.ranks:
            return ["no expert-cache telemetry was parsed"] + self.problems
        first = self.ranks[min(self.ranks)]
        same = all(r.totals == first.totals and r.steps == first.steps for r in self.ranks.values())
        t, n = (first.totals, 1) if same else (self.totals, len(self.ranks))
        per = "per rank" if same else f"summed over {n} ranks"
        steps = f" over {first.steps:,} steps" if same and first.steps else ""
        waste = self.wasted_gb_per_step_per_rank
        if t.prefetched:
            w = f"~{waste:.2f} GB per step wasted per rank" if waste is not None else \
                "wasted bytes per step n/a (no slab size or step count)"
            share = f", {_pct(t.useless / t.moved)} of all gather traffic" if t.moved else ""
            out.append(f"prefetch precision {_pct(t.precision)}: {w} ({t.prefetched:,} slabs "
                       f"prefetched to serve {t.served_by_prefetch:,}; {t.useless:,} useless "
                       f"copies{share})")
        else:
            out.append("no prefetch traffic: 0 slabs prefetched (prefetch off)")
        hit = f"hit rate {_pct(t.hit_rate, 2)} ({t.hits:,}/{t.routed:,}) {per}{steps}"
        res, swp = first.kind("resident"), first.kind("swap")
        if res:
            hit += (f"; resident layers {_layer_range([x.layer for x in res])} at "
                    f"{_pct(sum(x.counts.hits for x in res) / max(1, sum(x.counts.routed for x in res)))}")
        rates = [x.counts.hit_rate for x in swp if x.counts.hit_rate is not None]
        if rates:
            lo, hi = f"{min(rates) * 100:.0f}", f"{max(rates) * 100:.0f}"
            hit += f"; swap layers {_layer_range([x.layer for x in swp])} at {lo if lo == hi else lo + '-' + hi} %"
        out.append(hit)
        out.append(f"host installs {t.installs:,}, read-through {t.read_through:,}, "
                   f"prefetched {t.prefetched:,}, served by prefetch {t.served_by_prefetch:,} ({per})")
        if swp and first.steps:
            k = len(swp) * first.steps
            s = Counts()
            for x in swp:
                s = s + x.counts
            out.append(f"per layer-step at a swap layer: ~{s.routed / k:.1f} routed, "
                       f"{s.hits / k:.1f} hits, {s.installs / k:.1f} installs, "
                       f"{s.read_through / k:.1f} read-through, {s.prefetched / k:.1f} prefetched"
                       + (f" of which {s.served_by_prefetch / k:.1f} useful" if s.prefetched else ""))
        g = self.gather_gb_per_step_per_rank
        if g is not None:
            out.append(f"gather traffic {self.moved_slabs_per_step_per_rank:,.0f} slabs = "
                       f"{g:.2f} GB per step per rank (installs + read-through + prefetched)")
        if len(self.ranks) > 1:
            out.append("all ranks identical" if same else "ranks differ: " + "; ".join(
                f"rank {r}: precision {_pct(s.totals.precision)}, hit rate {_pct(s.totals.hit_rate, 2)}"
                for r, s in sorted(self.ranks.items())))
        return out + self.problems


def slab_bytes_from_plan(plan: Mapping | None) -> int | None:
    """The expert slab size from a parsed memory plan (``slab_mib``), in bytes."""
    mib = (plan or {}).get("slab_mib")
    return int(round(float(mib) * MIB)) if mib else None


def report_from_texts(texts: Mapping[str, str | bytes], *, ranks: int | None = None,
                      slab_bytes: int | None = None) -> TelemetryReport:
    """Pure: {file name: content} -> report. ``ranks`` (the engine's TP size) names the files
    expected; without it, ranks 0..highest seen are expected."""
    got: dict[int, RankStats] = {}
    problems: list[str] = []
    seen: set[int] = set()
    for name in sorted(texts):
        m = FILE_RE.search(name)
        if m:
            seen.add(int(m.group(1)))
        try:
            r = parse_rank(texts[name], Path(name).name, slab_bytes)
        except ValueError as e:
            problems.append(f"rank {m.group(1) if m else '?'}: {e}; not counted")
            continue
        got[r.rank] = r
    top = max(seen | set(got), default=-1)
    expected = tuple(range(ranks if ranks else top + 1))
    missing = tuple(r for r in expected if r not in seen and r not in got)
    problems += [f"rank {r}: expert_cache_rank{r}.json missing" for r in missing]
    for r in got.values():
        if not r.steps:
            problems.append(f"rank {r.rank}: no step count in {r.source}; per-step figures n/a")
    return TelemetryReport(got, expected, missing, problems)


def telemetry_files(folder: Path) -> list[Path]:
    return sorted(p for p in Path(folder).rglob("expert_cache_rank*.json") if FILE_RE.search(p.name))


def load_report(folder: Path, *, ranks: int | None = None, slab_bytes: int | None = None) -> TelemetryReport:
    """Read every ``expert_cache_rank<N>.json`` under ``folder`` and parse them."""
    return report_from_texts({str(p): p.read_bytes() for p in telemetry_files(folder)},
                             ranks=ranks, slab_bytes=slab_bytes)
