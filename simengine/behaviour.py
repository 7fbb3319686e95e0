"""What a booted simulated engine does: the contract between the planner and the HTTP server.

``simengine.landscape`` turns (landscape file, parsed CLI args, env) into one ``Behaviour`` at
boot; ``simengine.server`` serves requests from it and never reads the landscape itself.
Stdlib only.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CorruptRule:
    """Degenerate numerics (e.g. TunableOp with offload): a repetition loop that the server's
    "repetition detected" guard halts early, streamed fast and with inflated acceptance."""

    halt_min: int = 140          # completion tokens at which the halt fires, inclusive range
    halt_max: int = 146
    tok_s_factor: float = 3.0    # the degenerate stream runs this much faster than the true rate
    acceptance: float = 0.965    # acceptance reported while looping (spec decode only)


@dataclass(frozen=True)
class Behaviour:
    model: str                            # served model name (the MODEL argument)
    max_model_len: int
    decode_tok_s: dict[int, float]        # true single-stream decode rate at reference depths;
                                          # linear in depth between them, flat outside
    noise_sigma: float = 0.0              # relative sigma of the per-request rate (0 = exact)
    prefill_tok_s: float = 3000.0         # TTFT = base_ttft_s + prompt_tokens / prefill_tok_s
    base_ttft_s: float = 0.05
    prefix_caching: bool = False          # a repeated prompt prefix skips its prefill (prefixcache)
    spec_k: int = 0                       # speculative tokens per step (0 = no spec decode)
    acceptance: float = 0.0               # per-draft-token acceptance probability
    ignore_eos: bool = True               # always produce max_tokens unless halted
    text_variant: str = ""                # numerics class; "" is the reference numerics
    diverge_after: int = 24               # tokens shared with the reference by other variants
    corrupt: CorruptRule | None = None
    max_num_seqs: int = 4                 # admission limit; extra requests queue
    batch_efficiency: float = 0.85        # per-stream rate factor per extra concurrent stream:
                                          # rate_b = rate * batch_efficiency ** (b - 1)
    telemetry: bool = False               # R4D_LRU_TELEMETRY=1
    profiler_dir: str | None = None       # where /stop_profile writes expert_cache_rank<N>.json
    profiler_with_stack: bool = True      # torch_profiler_with_stack (the fork's default)
    stop_profile_hang_s: float = 0.0      # /stop_profile blocks this long (with_stack hang)
    tp: int = 1                           # ranks, one telemetry file each
    slab_bytes: int = 2_457_862           # one expert slab (2.344 MiB)
    resident_layers: int = 3
    swap_layers: int = 45
    # per layer and decode step, by layer kind ("resident", "swap"):
    # routed, hits, installs, read_through, prefetched, served_by_prefetch
    expert_counters: dict[str, dict[str, float]] = field(default_factory=dict)
    fault: str | None = None              # SIMENGINE_FAULT: stall | no-usage | garbage | http500
    seed: int = 0                         # text: temperature-0 output is the same on every boot
    noise_seed: int = 0                   # decode noise: a new stream on every boot
    drift_per_h: float = 0.0              # landscape drift_per_hour: rate x exp(drift x hours since epoch)
    drift_steps: tuple = ()               # landscape drift_step: ((seconds since epoch, factor), ...)
    tenants: tuple = ()                   # landscape tenant: ((from s, until s, cores, factor), ...)
    boot_factor: float = 1.0              # this boot's spread x its cold start (simengine.realbox)
    warmup_requests: int = 0              # landscape warmup: the first N requests ramp from
    warmup_factor: float = 1.0            # warmup_factor up to 1
    stream_interval: int = 1              # SIMENGINE_STREAM_INTERVAL, like vLLM's --stream-interval:
                                          # decode steps coalesce into one SSE chunk until it holds
                                          # this many tokens (the first token is always its own)
