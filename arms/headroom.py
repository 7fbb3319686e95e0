"""Headroom to the physical limit: how far decode is from what the PCIe link allows (seed 002:
"effective gather ~6.5-9.5 GB/s vs 22.7 GB/s the link delivers at the same slab size").

Pure arithmetic. Per rank and decode step the engine copies ``slabs_per_step`` expert slabs
host -> device (installs + read-through + prefetched, from the expert-cache telemetry) of
``slab_bytes`` each (the memory plan). A decode step yields ``tokens_per_step`` tokens (1
without spec decode; 1 + acceptance x spec tokens, or the mean acceptance length, with it), so

    steps/s          = decode tok/s / tokens_per_step
    bytes per token  = slabs_per_step x slab_bytes / tokens_per_step
    effective gather = slabs_per_step x slab_bytes x steps/s              (GB/s per rank)
    ceiling decode   = tokens_per_step / (compute_s_per_step + bytes_per_step / link)

With ``compute_s_per_step`` 0 (the default) the ceiling is the pure wire bound and the share of
it reached equals effective gather / link. The link figure is the campaign's or the operator's
probe (``host.linkprobe.link_probe_gbs``); without one, the ceiling is "n/a".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GB = 1e9


def tokens_per_step(acceptance: float | None = None, spec_k: int = 0,
                    mean_acceptance_length: float | None = None) -> float:
    """Tokens one decode step yields: the mean acceptance length when known, else
    1 + acceptance x spec tokens, else 1."""
    if mean_acceptance_length and mean_acceptance_length >= 1:
        return float(mean_acceptance_length)
    if acceptance is not None and spec_k > 0:
        return 1.0 + float(acceptance) * spec_k
    return 1.0


@dataclass(frozen=True)
class Headroom:
    slab_bytes: int
    slabs_per_step: float             # per rank
    decode_tok_s: float
    tokens_per_step: float
    link_gbs: float | None = None     # host -> device GB/s at slab size, per rank's link
    link_source: str = "n/a"          # campaign | probe | n/a
    compute_s_per_step: float = 0.0

    @property
    def bytes_per_step(self) -> float:
        return self.slabs_per_step * self.slab_bytes

    @property
    def steps_per_s(self) -> float:
        return self.decode_tok_s / self.tokens_per_step

    @property
    def bytes_per_token(self) -> float:
        return self.bytes_per_step / self.tokens_per_step

    @property
    def gather_gbs(self) -> float:
        return self.bytes_per_step * self.steps_per_s / GB

    @property
    def ceiling_tok_s(self) -> float | None:
        if not self.link_gbs or self.link_gbs <= 0:
            return None
        step_s = self.compute_s_per_step + self.bytes_per_step / (self.link_gbs * GB)
        return self.tokens_per_step / step_s if step_s > 0 else None

    @property
    def reached(self) -> float | None:
        """Measured decode as a share of the ceiling decode."""
        c = self.ceiling_tok_s
        return self.decode_tok_s / c if c else None

    @property
    def link_share(self) -> float | None:
        """Effective gather rate as a share of the link rate."""
        return self.gather_gbs / self.link_gbs if self.link_gbs else None

    def to_dict(self) -> dict[str, Any]:
        return {"slab_bytes": self.slab_bytes, "slabs_per_step": self.slabs_per_step,
                "decode_tok_s": self.decode_tok_s, "tokens_per_step": self.tokens_per_step,
                "steps_per_s": self.steps_per_s, "bytes_per_step": self.bytes_per_step,
                "bytes_per_token": self.bytes_per_token, "gather_gbs": self.gather_gbs,
                "link_gbs": self.link_gbs, "link_source": self.link_source,
                "compute_s_per_step": self.compute_s_per_step,
                "ceiling_tok_s": self.ceiling_tok_s, "reached": self.reached,
                "link_share": self.link_share, "findings": self.findings()}

    def findings(self) -> list[str]:
        out = [f"{self.bytes_per_step / GB:.2f} GB gathered per step per rank "
               f"({self.slabs_per_step:,.0f} slabs) = {self.bytes_per_token / GB:.3f} GB per decoded "
               f"token at {self.tokens_per_step:.2f} tokens/step"]
        if self.link_gbs:
            out.append(f"effective gather {self.gather_gbs:.1f} GB/s vs {self.link_gbs:.1f} GB/s the "
                       f"link delivers at slab size ({self.link_share * 100:.0f} %, link from {self.link_source})")
            extra = f" plus {self.compute_s_per_step * 1e3:.0f} ms compute per step" \
                if self.compute_s_per_step else ""
            out.append(f"ceiling decode ~{self.ceiling_tok_s:.1f} tok/s if the gather ran at link "
                       f"rate{extra}: {self.decode_tok_s:.1f} tok/s is {self.reached * 100:.0f} % of it")
        else:
            out.append(f"effective gather {self.gather_gbs:.1f} GB/s; link bandwidth n/a (give "
                       f"it in the campaign or run host.linkprobe.link_probe_gbs)")
        return out


def headroom(*, slab_bytes: int, slabs_per_step: float, decode_tok_s: float,
             acceptance: float | None = None, spec_k: int = 0,
             mean_acceptance_length: float | None = None, link_gbs: float | None = None,
             link_source: str | None = None, compute_s_per_step: float = 0.0) -> Headroom:
    if slab_bytes <= 0 or slabs_per_step < 0 or decode_tok_s <= 0:
        raise ValueError(f"headroom needs a slab size > 0, slabs per step >= 0 and decode > 0 "
                         f"(got {slab_bytes}, {slabs_per_step}, {decode_tok_s})")
    return Headroom(int(slab_bytes), float(slabs_per_step), float(decode_tok_s),
                    tokens_per_step(acceptance, spec_k, mean_acceptance_length),
                    float(link_gbs) if link_gbs else None,
                    link_source or ("campaign" if link_gbs else "n/a"), float(compute_s_per_step))


def headroom_from(report: Any, *, decode_tok_s: float | None, acceptance: float | None = None,
                  spec_k: int = 0, mean_acceptance_length: float | None = None,
                  link_gbs: float | None = None, link_source: str | None = None,
                  slab_bytes: int | None = None,
                  compute_s_per_step: float = 0.0) -> Headroom | None:
    """From a ``TelemetryReport`` (slabs moved per step per rank, slab size) and a measured
    decode; None when any input is missing (no telemetry, no step count, no decode)."""
    if report is None or not decode_tok_s:
        return None
    slabs, slab = report.moved_slabs_per_step_per_rank, slab_bytes or report.slab_bytes
    if slabs is None or not slab:
        return None
    return headroom(slab_bytes=slab, slabs_per_step=slabs, decode_tok_s=decode_tok_s,
                    acceptance=acceptance, spec_k=spec_k,
                    mean_acceptance_length=mean_acceptance_length, link_gbs=link_gbs,
                    link_source=link_source, compute_s_per_step=compute_s_per_step)


# -- llama.cpp with experts in host RAM: the memory-bandwidth roofline --------------------------
# On a CPU (or for the layers whose experts stay in host RAM) every decoded token streams the
# weights it uses from RAM: the active experts (used of experts, every layer), attention, the
# router, the norms and the output matrix; one row of the token embedding. So decode can not
# beat  host memory bandwidth / bytes per token,  whatever the threads or batch sizes.

def bytes_per_token(tensors, n_expert: int, n_expert_used: int) -> int:
    """Weight bytes one decoded token reads, from the model's (tensor name, bytes, rows) list:
    ``*_exps`` tensors at used/experts of their size, ``token_embd`` one row, the rest whole."""
    total = 0.0
    for name, nbytes, rows in tensors:
        if "_exps" in name and n_expert > 0:
            total += nbytes * min(n_expert_used, n_expert) / n_expert
        elif name.startswith("token_embd"):
            total += nbytes / max(rows, 1)
        else:
            total += nbytes
    return int(total)


@dataclass(frozen=True)
class Roofline:
    bytes_per_token: int
    decode_tok_s: float
    bandwidth_gbs: float | None       # host memory read bandwidth
    bandwidth_source: str = "n/a"

    @property
    def ceiling_tok_s(self) -> float | None:
        return self.bandwidth_gbs * GB / self.bytes_per_token if self.bandwidth_gbs and self.bytes_per_token else None

    @property
    def reached(self) -> float | None:
        c = self.ceiling_tok_s
        return self.decode_tok_s / c if c else None

    @property
    def effective_gbs(self) -> float:
        return self.decode_tok_s * self.bytes_per_token / GB

    def to_dict(self) -> dict[str, Any]:
        return {"bytes_per_token": self.bytes_per_token, "decode_tok_s": self.decode_tok_s,
                "bandwidth_gbs": self.bandwidth_gbs, "bandwidth_source": self.bandwidth_source,
                "ceiling_tok_s": self.ceiling_tok_s, "reached": self.reached,
                "effective_gbs": self.effective_gbs, "findings": self.findings()}

    def findings(self) -> list[str]:
        head = (f"{self.bytes_per_token / 1e6:,.1f} MB of weights read per decoded token; "
                f"{self.decode_tok_s:,.1f} tok/s streams {self.effective_gbs:,.2f} GB/s")
        if not self.ceiling_tok_s:
            return [head + "; host memory bandwidth n/a (run host.membw)"]
        return [head, f"roofline: {self.bandwidth_gbs:,.1f} GB/s host memory bandwidth "
                      f"({self.bandwidth_source}) / {self.bytes_per_token / 1e6:,.1f} MB = "
                      f"{self.ceiling_tok_s:,.1f} tok/s; decode is {self.reached * 100:.0f} % of it"]
