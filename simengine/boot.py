"""The boot sequence of the simulated engine: log lines, real (scaled) waits, failures."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

from . import planner
from .planner import BootFailure, Plan


class Boot:
    def __init__(self, land, ns, values: dict, nda: dict, *, env: dict, time_scale: float,
                 noise_sigma: float, log, sleep=time.sleep):
        self.land, self.ns, self.values, self.nda = land, ns, values, nda
        self.env, self.ts, self.noise, self.log, self.sleep = env, time_scale, noise_sigma, log, sleep
        self.boot = land.get("boot", {})
        self.rules = planner.matching_rules(land, values)
        self.t0 = time.monotonic()

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

    def _hang(self, phase: str) -> None:
        for r in self.rules:
            h = r.get("hang")
            if h and (h is True or h.get("after", "compile") == phase):
                self.log("Waiting for core engine processes to start...", where="utils.py:845")
                while True:        # stops logging and never becomes ready: a hang
                    time.sleep(3600)

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
        if artifact.exists():
            t = self._wait(self.boot.get("cache_load_s", 2.143))
            self.log(f"Directly load the compiled graph(s) for compile range {crange} from the cache, took {t:.3f} s",
                     where="backends.py:311")
            total = t + self._wait(1.8)
        else:
            d = self._wait(self.boot.get("dynamo_s", 4.99))
            self.log(f"Dynamo bytecode transform time: {d:.2f} s", where="backends.py:560")
            c = self._wait(self.boot.get("compile_s", 176.2))
            self.log(f"Compiling a graph for compile range {crange} takes {c:.2f} s", where="backends.py:418")
            total = d + c + self._wait(3.0)
            try:
                cdir.mkdir(parents=True, exist_ok=True)
                artifact.write_text(json.dumps({"key": key, "range": crange}))
                self.log(f"saved AOT compiled function to {cdir.parent.parent}/torch_aot_compile/{key}",
                         where="backends.py:470")
            except OSError as e:     # a read-only cache is a miss next time too, never fatal
                self.log(f"could not save the compile cache: {e}", level="WARNING", where="backends.py:472")
        self.log(f"torch.compile took {total:.2f} s in total", where="monitor.py:20")
        return total

    # -- the boot ------------------------------------------------------------------------
    def run(self) -> int:
        from .server import start_server

        ns, log = self.ns, self.log
        log.api("vLLM API server version 0.29.0.dev0+sim")
        log.api(f"non-default args: {self.nda}", where="utils.py:278")
        server = start_server(ns.host, ns.port, log=log.raw)
        signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
        plan = planner.make_plan(self.land, self.values)
        tp = ns.tensor_parallel_size
        log(f"Initializing a V1 LLM engine (v0.29.0.dev0+sim) with config: model='{ns.model_tag}', "
            f"max_seq_len={plan.max_model_len}, tensor_parallel_size={tp}, kv_cache_dtype={ns.kv_cache_dtype}, "
            f"speculative_config={ns.speculative_config}", where="core.py:93")
        fail = planner.memory_failure(self.land, plan, self.values, "startup") or self._rule_fail("startup")
        if fail:
            return self._fail(fail)
        t = self._wait(self.boot.get("load_s", 240.0))
        log(f"Model loading took {plan.non_expert_gib:.2f} GiB memory and {t:.6f} seconds",
            where="gpu_model_runner.py:5089")
        self._plan_lines(plan)
        fail = planner.memory_failure(self.land, plan, self.values, "plan")
        if fail:
            return self._fail(fail)
        t_init = time.monotonic()
        extra = sum(float(r.get("boot_extra_s", 0)) for r in self.rules)
        if extra:
            log(f"TunableOp warmup sweep: {extra * self.ts:.1f} s", where="tunableop_warmup.py:88")
            self._wait(extra)
        compile_s = self._compile()
        self._hang("compile")
        fail = self._rule_fail("profile")
        if fail:
            return self._fail(fail)
        log(f"Available KV cache memory: {round(plan.kv_pool_gib, 2)} GiB", where="gpu_worker.py:773")
        fail = planner.memory_failure(self.land, plan, self.values, "kv") or self._rule_fail("kv")
        if fail:
            return self._fail(fail)
        log(f"GPU KV cache size: {plan.kv_tokens:,} tokens, Maximum concurrency for {plan.max_model_len:,} tokens "
            f"per request: {plan.max_concurrency:.2f}x", where="kv_cache_utils.py:1148")
        fail = planner.memory_failure(self.land, plan, self.values, "graphs") or self._rule_fail("graphs")
        if fail:
            return self._fail(fail)
        g = self._wait(self.boot.get("graph_capture_s", 12.0))
        log(f"Graph capturing finished in {g:.0f} secs, took {plan.graphs_gib:.2f} GiB", where="gpu_model_runner.py:6517")
        fail = self._rule_fail("init")
        if fail:
            return self._fail(fail)
        self._wait(self.boot.get("init_other_s", 24.0))
        self._hang("init")
        init = time.monotonic() - t_init
        log(f"init engine (profile, create kv cache, warmup model) took {init:.2f} s (compilation: {compile_s:.2f} s)",
            where="core.py:396")
        self._wait(self.boot.get("api_s", 2.0))
        behaviour = self._behaviour(plan)
        log.api(f"Starting vLLM server on http://{ns.host}:{server.port}", where="api_server.py:1400")
        log.api("Started server process [1]", where="server.py:83")
        log.api("Waiting for application startup.", where="on.py:48")
        log.api("Application startup complete.", where="on.py:62")
        server.set_ready(behaviour)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
        server.shutdown()
        return 0

    def _behaviour(self, plan: Plan):
        ns = self.ns
        pc = ns.profiler_config or {}
        profiler_dir = pc.get("torch_profiler_dir") or self.env.get("VLLM_TORCH_PROFILER_DIR")
        with_stack = bool(pc.get("torch_profiler_with_stack",
                                 self.env.get("VLLM_TORCH_PROFILER_WITH_STACK", "1") not in ("0", "false")))
        return planner.build_behaviour(
            self.land, self.values, plan, model=ns.served_model_name or ns.model_tag, tp=ns.tensor_parallel_size,
            profiler_dir=profiler_dir, with_stack=with_stack, fault=self.env.get("SIMENGINE_FAULT") or None,
            noise_sigma=self.noise, time_scale=self.ts)
