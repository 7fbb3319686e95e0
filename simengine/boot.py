"""The boot sequence of the simulated engine: log lines, (scaled) waits, failures.

``Boot.boot()`` runs the sequence on its ``clock``/``sleep`` and returns a ``BootOutcome``: an
exit code (a failed boot), a ``Behaviour`` to serve (a ready boot), or ``hung``. ``Boot.run()``
is the real engine: it starts the HTTP server when the API server would, boots with real
sleeps, then serves until killed. The simulated host (``host/simhost.py``) calls ``boot()``
with a virtual clock and its own file hooks instead.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import planner, realbox
from .behaviour import Behaviour
from .planner import BootFailure, Plan


@dataclass(frozen=True)
class BootOutcome:
    exit_code: int | None = None          # a failed boot: the engine's exit code
    behaviour: Behaviour | None = None    # a ready boot: what it serves
    hung: bool = False                    # a hang rule: no more log lines, never ready
    port: int | None = None               # where it serves


def _save(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


class Boot:
    """One boot. ``exists``/``save`` are the engine's view of its file system (the compile
    cache), ``clock``/``sleep`` its time; the defaults are the real ones."""

    def __init__(self, land, ns, values: dict, nda: dict, *, env: dict, time_scale: float,
                 noise_sigma: float, log, sleep=time.sleep, clock: Callable[[], float] = time.monotonic,
                 exists: Callable[[str], bool] = os.path.exists,
                 save: Callable[[str, str], None] = _save):
        self.land, self.ns, self.values, self.nda = land, ns, values, nda
        self.env, self.ts, self.noise, self.log, self.sleep = env, time_scale, noise_sigma, log, sleep
        self.clock, self.exists, self.save = clock, exists, save
        self.boot_costs = land.get("boot", {})
        self.rules = planner.matching_rules(land, values)
        self.port = ns.port
        self.seed = self._noise_seed()          # this boot's noise stream: its requests' and its spread
        self.terms = realbox.BootTerms()

    # -- helpers -------------------------------------------------------------------------
    def _wait(self, seconds: float) -> float:
        real = max(0.0, float(seconds)) * self.ts
        if real:
            self.sleep(real)
        return real

    def _fail(self, failure: BootFailure) -> int:
        log = self.log
        log("EngineCore failed to start.", level="ERROR", where="core.py:708")
        log("Traceback (most recent call last):", level="ERROR", where="core.py:708")
        log('  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 699, in run_engine_core',
            level="ERROR", where="core.py:708")
        log("    engine_core = EngineCoreProc(*args, **kwargs)", level="ERROR", where="core.py:708")
        for line in failure.lines:
            log(line, level="ERROR", where="core.py:708")
        self.log.api("RuntimeError: Engine core initialization failed. See root cause above. "
                     "Failed core proc(s): {'EngineCore_DP0': 1}", where="launcher.py:101")
        return 1

    def _rule_fail(self, phase: str) -> BootFailure | None:
        for r in self.rules:
            if r.get("fail") is not None:
                f = planner.rule_failure(r, self.values)
                if f.phase == phase:
                    return f
        return None

    def _hang(self, phase: str) -> bool:
        for r in self.rules:
            h = r.get("hang")
            if h and (h is True or h.get("after", "compile") == phase):
                self.log("Waiting for core engine processes to start...", where="utils.py:845")
                return True        # stops logging and never becomes ready: a hang
        return False

    def _plan_lines(self, p: Plan) -> None:
        L = lambda m, ln: self.log(f"Expert plan: {m}", where=f"expert_plan.py:{ln}")  # noqa: E731
        L(f"budget {p.budget_gib:.2f} GiB = {p.util:g} x {p.total_gib:.2f} GiB; non-expert weights {p.non_expert_gib:.2f} GiB", 210)
        L(f"KV reserve (one max-len request +8%) {p.kv_reserve_gib:.2f} GiB of the {p.kv_pool_gib:.2f} GiB pool", 214)
        L(f"CUDA graphs {p.graphs_gib:.2f} GiB ({p.graphs_count} graphs)", 217)
        mem = self.land["memory"]
        label = f"precise ({mem.get('precise_label', 'fitted')})" if p.overhead_precise else "non-torch + buffers + activation"
        L(f"runtime overhead {p.overhead_gib:.2f} GiB ({label})", 221)
        if p.prefetch_depth:
            per_layer = 16 * p.prefetch_depth
            L(f"prefetch depth {p.prefetch_depth} ({per_layer} slots/layer, {per_layer * p.swap_layers:,} total)", 225)
        L(f"expert cache space {p.arena_gib:.2f} GiB = {p.slots:,} slots x {p.slab_mib:.3f} MiB", 229)
        L(f"VRAM-only resident layers {p.resident_gib:.2f} GiB (layers 0-{p.resident_layers - 1}, {p.resident_experts:,} experts)", 233)
        lo = p.swap_slots // max(p.swap_layers, 1)
        hi = lo + (1 if p.swap_slots % max(p.swap_layers, 1) else 0)
        L(f"swap region {p.swap_gib:.2f} GiB ({p.swap_slots:,} slots, {lo}-{hi}/layer)", 236)
        L(f"host-backed experts {p.host_backed_gib:.2f} GiB per rank, {p.host_backed_experts:,} experts", 240)

    def _compile(self) -> float:
        ns = self.ns
        key = planner.compile_key(self.values, self.land.get("name", "landscape"))
        home = self.env.get("HOME") or "/root"
        root = Path(self.env.get("VLLM_CACHE_ROOT") or os.path.join(home, ".cache", "vllm"))
        cdir = root / "torch_compile_cache" / key / "rank_0_0" / "backbone"
        self.log(f"Using cache directory: {cdir}", where="backends.py:540")
        crange = f"(1, {ns.max_num_batched_tokens})"
        artifact = cdir / "artifact.json"
        if ns.enforce_eager:
            return 0.0
        if self.exists(str(artifact)):
            t = self._wait(self.boot_costs.get("cache_load_s", 2.143))
            self.log(f"Directly load the compiled graph(s) for compile range {crange} from the cache, took {t:.3f} s",
                     where="backends.py:311")
            total = t + self._wait(1.8)
        else:
            d = self._wait(self.boot_costs.get("dynamo_s", 4.99))
            self.log(f"Dynamo bytecode transform time: {d:.2f} s", where="backends.py:560")
            c = self._wait(self.boot_costs.get("compile_s", 176.2))
            self.log(f"Compiling a graph for compile range {crange} takes {c:.2f} s", where="backends.py:418")
            total = d + c + self._wait(3.0)
            try:
                self.save(str(artifact), json.dumps({"key": key, "range": crange}))
                self.log(f"saved AOT compiled function to {cdir.parent.parent}/torch_aot_compile/{key}",
                         where="backends.py:470")
            except OSError as e:     # a read-only cache is a miss next time too, never fatal
                self.log(f"could not save the compile cache: {e}", level="WARNING", where="backends.py:472")
        self.log(f"torch.compile took {total:.2f} s in total", where="monitor.py:20")
        return total

    # -- the boot ------------------------------------------------------------------------
    def run(self) -> int:
        """The real engine: boot with the HTTP server up (503 until ready), then serve until
        killed; returns a failed boot's exit code."""
        from .server import start_server

        server = None

        def api_up() -> int:
            nonlocal server
            server = start_server(self.ns.host, self.ns.port, log=self.log.raw)
            signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
            return server.port

        out = self.boot(api_up)
        if out.exit_code is not None:
            return out.exit_code
        if out.hung:
            while True:            # never ready; SIGTERM/SIGKILL end it
                time.sleep(3600)
        server.set_ready(out.behaviour)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
        server.shutdown()
        return 0

    def boot(self, api_up: Callable[[], int] | None = None) -> BootOutcome:
        """The boot sequence; ``api_up`` starts the API server when the engine would (it
        returns the port it listens on)."""
        ns, log = self.ns, self.log
        log.api("vLLM API server version 0.29.0.dev0+sim")
        log.api(f"non-default args: {self.nda}", where="utils.py:278")
        if api_up is not None:
            self.port = api_up()
        plan = planner.make_plan(self.land, self.values)
        tp = ns.tensor_parallel_size
        log(f"Initializing a V1 LLM engine (v0.29.0.dev0+sim) with config: model='{ns.model_tag}', "
            f"max_seq_len={plan.max_model_len}, tensor_parallel_size={tp}, kv_cache_dtype={ns.kv_cache_dtype}, "
            f"speculative_config={ns.speculative_config}", where="core.py:93")
        fail = planner.memory_failure(self.land, plan, self.values, "startup") or self._rule_fail("startup")
        if fail:
            return self._failed(fail)
        index = realbox.boot_index(self.env) if self.land.get("cold_start") else None
        self.terms = realbox.boot_terms(self.land.data, self.seed, index)
        t = self._wait(self.boot_costs.get("load_s", 240.0) * self.terms.load_factor)
        log(f"Model loading took {plan.non_expert_gib:.2f} GiB memory and {t:.6f} seconds",
            where="gpu_model_runner.py:5089")
        self._plan_lines(plan)
        fail = planner.memory_failure(self.land, plan, self.values, "plan")
        if fail:
            return self._failed(fail)
        t_init = self.clock()
        extra = sum(float(r.get("boot_extra_s", 0)) for r in self.rules)
        if extra:
            log(f"TunableOp warmup sweep: {extra * self.ts:.1f} s", where="tunableop_warmup.py:88")
            self._wait(extra)
        compile_s = self._compile()
        if self._hang("compile"):
            return BootOutcome(hung=True, port=self.port)
        fail = self._rule_fail("profile")
        if fail:
            return self._failed(fail)
        log(f"Available KV cache memory: {round(plan.kv_pool_gib, 2)} GiB", where="gpu_worker.py:773")
        fail = planner.memory_failure(self.land, plan, self.values, "kv") or self._rule_fail("kv")
        if fail:
            return self._failed(fail)
        log(f"GPU KV cache size: {plan.kv_tokens:,} tokens, Maximum concurrency for {plan.max_model_len:,} tokens "
            f"per request: {plan.max_concurrency:.2f}x", where="kv_cache_utils.py:1148")
        fail = planner.memory_failure(self.land, plan, self.values, "graphs") or self._rule_fail("graphs")
        if fail:
            return self._failed(fail)
        g = self._wait(self.boot_costs.get("graph_capture_s", 12.0))
        log(f"Graph capturing finished in {g:.0f} secs, took {plan.graphs_gib:.2f} GiB", where="gpu_model_runner.py:6517")
        fail = self._rule_fail("init")
        if fail:
            return self._failed(fail)
        self._wait(self.boot_costs.get("init_other_s", 24.0))
        if self._hang("init"):
            return BootOutcome(hung=True, port=self.port)
        init = self.clock() - t_init
        log(f"init engine (profile, create kv cache, warmup model) took {init:.2f} s (compilation: {compile_s:.2f} s)",
            where="core.py:396")
        self._wait(self.boot_costs.get("api_s", 2.0))
        behaviour = self._behaviour(plan)
        log.api(f"Starting vLLM server on http://{ns.host}:{self.port}", where="api_server.py:1400")
        log.api("Started server process [1]", where="server.py:83")
        log.api("Waiting for application startup.", where="on.py:48")
        log.api("Application startup complete.", where="on.py:62")
        return BootOutcome(behaviour=behaviour, port=self.port)

    def _failed(self, failure: BootFailure) -> BootOutcome:
        return BootOutcome(exit_code=self._fail(failure), port=self.port)

    def _behaviour(self, plan: Plan):
        ns = self.ns
        pc = ns.profiler_config or {}
        profiler_dir = pc.get("torch_profiler_dir") or self.env.get("VLLM_TORCH_PROFILER_DIR")
        with_stack = bool(pc.get("torch_profiler_with_stack",
                                 self.env.get("VLLM_TORCH_PROFILER_WITH_STACK", "1") not in ("0", "false")))
        return planner.build_behaviour(
            self.land, self.values, plan, model=ns.served_model_name or ns.model_tag, tp=ns.tensor_parallel_size,
            profiler_dir=profiler_dir, with_stack=with_stack, fault=self.env.get("SIMENGINE_FAULT") or None,
            noise_sigma=self.noise, time_scale=self.ts, noise_seed=self.seed,
            stream_interval=self._stream_interval(), boot=self.terms)

    def _stream_interval(self) -> int:
        """SIMENGINE_STREAM_INTERVAL (default 1: one SSE chunk per decode step, as vLLM's
        --stream-interval 1); the simulated host coalesces to keep virtual nights cheap."""
        v = self.env.get("SIMENGINE_STREAM_INTERVAL")
        try:
            return max(1, int(v)) if v not in (None, "") else 1
        except ValueError:
            return 1

    def _noise_seed(self) -> int:
        """SIMENGINE_NOISE_SEED when given (the simulated host sets one per container, so a night
        replays exactly); otherwise fresh per boot, like a real engine's run-to-run spread."""
        v = self.env.get("SIMENGINE_NOISE_SEED")
        if v not in (None, ""):
            return int(v)
        return int.from_bytes(os.urandom(4), "big")
