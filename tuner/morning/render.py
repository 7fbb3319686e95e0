"""Plain-text renderings for the terminal: a boot report as the seed's plan table."""
from __future__ import annotations

from dataclasses import replace


def _g(v, fmt="{:.2f}", unit=""):
    return "n/a" if v is None else fmt.format(v) + unit


def _int(v):
    return "n/a" if v is None else f"{int(v):,}"


def _by_key(d, unit: str = "MiB") -> str:
    if not isinstance(d, dict):
        return ""
    return ", ".join(f"{k} {v:,.2f} {unit}" if unit else f"{k} {v:,}" for k, v in d.items())


def llamacpp_plan_rows(p: dict) -> list[tuple[str, str]]:
    """llama-server's memory plan (per backend, as its log prints it)."""
    rows = []
    if p.get("model_buffers_mib"):
        rows.append(("model buffers", _by_key(p["model_buffers_mib"])))
    if p.get("tensor_overrides"):
        rows.append(("tensors overridden (-ot/--n-cpu-moe)", _by_key(p["tensor_overrides"], "") + " tensors"))
    if p.get("kv_buffers_mib"):
        cells = f", {p['kv_cells']:,} cells" if p.get("kv_cells") is not None else ""
        types = f", K {p['kv_type_k']} / V {p['kv_type_v']}" if p.get("kv_type_k") else ""
        rows.append(("KV buffers", _by_key(p["kv_buffers_mib"]) + cells + types))
    if p.get("compute_buffers_mib"):
        rows.append(("compute buffers", _by_key(p["compute_buffers_mib"])))
    if p.get("n_ctx") is not None:
        per = f", {p['n_slots']} slot(s) x {p.get('n_ctx_slot', p.get('n_ctx_seq'))} tokens" if p.get("n_slots") else ""
        rows.append(("context", f"n_ctx {p['n_ctx']:,}{per}"))
    if p.get("n_batch") is not None or p.get("n_threads") is not None:
        rows.append(("batch / threads", f"n_batch {p.get('n_batch', '?')}, n_ubatch {p.get('n_ubatch', '?')}, "
                                        f"threads {p.get('n_threads', '?')}/{p.get('n_threads_batch', '?')}, "
                                        f"flash_attn {p.get('flash_attn', '?')}, load_mode {p.get('load_mode', '?')}"))
    if p.get("fit_status") or p.get("fit_layers") or p.get("fit_ctx"):
        parts = [p.get("fit_status") or ""]
        if p.get("fit_layers"):
            parts.append(_by_key(p["fit_layers"], "") + " layers")
        if p.get("fit_ctx"):
            parts.append(f"context reduced to {p['fit_ctx']:,}")
        rows.append(("--fit", "; ".join(x for x in parts if x)))
    return rows


def plan_rows(report) -> list[tuple[str, str]]:
    p = report.plan or {}
    rows = []
    if "expert_cache_gib" in p:
        rows.append(("expert cache space", f"{_g(p.get('expert_cache_gib'))} GiB = {_int(p.get('slots'))} slots x "
                                           f"{_g(p.get('slab_mib'), '{:.3f}')} MiB"))
    if "resident_gib" in p:
        rows.append(("VRAM-only resident layers", f"{_g(p.get('resident_gib'))} GiB ({p.get('resident_layers', '?')} layers, "
                                                  f"{_int(p.get('resident_experts'))} experts)"))
    if "swap_gib" in p:
        rows.append(("swap region", f"{_g(p.get('swap_gib'))} GiB ({_int(p.get('swap_slots'))} slots)"))
    if "host_backed_gib" in p:
        rows.append(("host-backed experts", f"{_g(p.get('host_backed_gib'))} GiB, {_int(p.get('host_backed_experts'))} experts"))
    if "kv_reserve_gib" in p:
        rows.append(("KV reserve", f"{_g(p.get('kv_reserve_gib'))} GiB of the {_g(p.get('kv_pool_gib'))} GiB pool"))
    if report.kv_pool_tokens is not None:
        conc = f", max concurrency {_g(report.max_concurrency)}x at {_int(report.max_concurrency_len)} tokens" \
            if report.max_concurrency is not None else ""
        rows.append(("KV pool", f"{_int(report.kv_pool_tokens)} tokens{conc}"))
    if "graphs_gib" in p:
        rows.append(("CUDA graphs", f"{_g(p.get('graphs_gib'))} GiB ({p.get('graphs_count', '?')} graphs)"))
    if "overhead_gib" in p:
        rows.append(("runtime overhead", f"{_g(p.get('overhead_gib'))} GiB" + (" (precise)" if p.get("overhead_precise") else "")))
    rows += llamacpp_plan_rows(p)
    if report.compile_s is not None or report.compile_cache_hit is not None:
        hit = {True: "cache hit", False: "cache miss", None: "no compile"}[report.compile_cache_hit]
        rows.append(("torch.compile", f"{_g(report.compile_s, '{:.1f}')} s ({hit})"))
    if report.model_load_gib is not None:
        rows.append(("model load", f"{_g(report.model_load_gib)} GiB in {_g(report.model_load_s, '{:.1f}')} s"))
    if report.init_engine_s is not None:
        rows.append(("init engine", f"{_g(report.init_engine_s, '{:.1f}')} s"))
    return rows


def boot_table(result, baseline=None, changes: dict | None = None) -> str:
    rep = result.report
    out = [f"arm {result.arm}: {result.outcome} after {result.boot_s:.1f} s",
           f"image {result.shape.image}"]
    if baseline is not None:
        for ch in replace(baseline, image=result.shape.image).diff(result.shape):
            out.append(f"change: {ch.describe()}")
    rows = plan_rows(rep)
    if rows:
        w = max(len(r[0]) for r in rows)
        out.append("")
        out.append(f"{'region'.ljust(w)}  size")
        out += [f"{k.ljust(w)}  {v}" for k, v in rows]
    if not result.ready or result.not_applied:
        out.append("")
        if result.not_applied:
            out.append(f"flag-not-applied: {', '.join(result.not_applied)} missing from the engine's non-default args")
        for line in rep.evidence:
            out.append(f"evidence: {line}")
    out.append(f"boot log: {result.log_path}")
    return "\n".join(out)


def arm_report(rec: dict) -> str:
    """A measured arm for the terminal: the seed-style table, quality, telemetry, probes."""
    from arms.measure import Measurement, format_table

    out = []
    m = rec.get("measurement")
    if m:
        out.append(format_table(Measurement.from_dict(m)))
    q = rec.get("quality") or {}
    if q:
        out.append(f"quality: {q.get('verdict')}" + "".join(f"\n  {e}" for e in q.get("evidence", [])))
    tel = rec.get("telemetry")
    if tel:
        out.append(f"telemetry: {tel.get('status')}" + "".join(f"\n  {f}" for f in tel.get("findings", [])))
        hr = tel.get("headroom")
        if hr:
            out.append("headroom:" + "".join(f"\n  {f}" for f in hr.get("findings", [])))
    pr = (rec.get("probes") or {}).get("summary")
    if pr:
        gib = lambda b: "n/a" if b is None else f"{b / 2**30:.2f} GiB"  # noqa: E731
        out.append(f"host probes: {pr.get('samples')} samples; RAM available min {gib(pr.get('ram_available_min_bytes'))}, "
                   f"engine RSS peak {gib(pr.get('engine_rss_peak_bytes'))}, VRAM {pr.get('vram_source')}, "
                   f"sampler CPU {pr.get('sampler_cpu_percent_of_core')}% of a core")
    out.append(f"verdict: {rec.get('verdict')}" + (f" ({rec['reason']})" if rec.get("reason") else ""))
    return "\n".join(out)
