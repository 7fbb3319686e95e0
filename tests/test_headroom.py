"""Headroom to the link: bytes per token, effective gather rate, ceiling decode (pure)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from arms.expert_cache import load_report, report_from_texts
from arms.headroom import Headroom, headroom, headroom_from, tokens_per_step

FIX = Path(__file__).parent / "fixtures" / "telemetry"
SLAB = 2_457_862
MOVED = (15814 + 13364 + 36720) / 102            # seed 002 slabs per step per rank, prefetch on


def test_tokens_per_step():
    assert tokens_per_step() == 1.0
    assert tokens_per_step(0.607, 4) == pytest.approx(3.428)
    assert tokens_per_step(0.607, 4, mean_acceptance_length=2.5) == 2.5
    assert tokens_per_step(0.6, 0) == 1.0                      # no spec decode


def test_seed_prefetch_on_arithmetic():
    h = headroom(slab_bytes=SLAB, slabs_per_step=MOVED, decode_tok_s=26.8, acceptance=0.607,
                 spec_k=4, link_gbs=22.74, link_source="probe")
    tps = 1 + 0.607 * 4
    bytes_step = MOVED * SLAB
    assert h.bytes_per_step == pytest.approx(bytes_step)
    assert h.steps_per_s == pytest.approx(26.8 / tps)
    assert h.bytes_per_token == pytest.approx(bytes_step / tps)
    assert h.gather_gbs == pytest.approx(bytes_step * 26.8 / tps / 1e9)
    assert h.ceiling_tok_s == pytest.approx(22.74e9 / bytes_step * tps)
    assert h.reached == pytest.approx(h.gather_gbs / 22.74) == pytest.approx(h.link_share)
    f = h.findings()
    assert f[1].startswith(f"effective gather {h.gather_gbs:.1f} GB/s vs 22.7 GB/s the link delivers")
    assert "link from probe" in f[1] and f[2].startswith("ceiling decode ~")
    json.dumps(h.to_dict())


def test_compute_time_lowers_the_ceiling():
    wire = headroom(slab_bytes=SLAB, slabs_per_step=MOVED, decode_tok_s=12.11, link_gbs=22.74)
    both = headroom(slab_bytes=SLAB, slabs_per_step=MOVED, decode_tok_s=12.11, link_gbs=22.74,
                    compute_s_per_step=0.1)
    assert both.ceiling_tok_s == pytest.approx(1 / (0.1 + MOVED * SLAB / 22.74e9))
    assert both.ceiling_tok_s < wire.ceiling_tok_s and both.reached > wire.reached
    assert "100 ms compute" in both.findings()[2]


def test_without_a_link_figure_the_ceiling_is_na():
    h = headroom(slab_bytes=SLAB, slabs_per_step=MOVED, decode_tok_s=26.8)
    assert h.link_gbs is None and h.ceiling_tok_s is None and h.reached is None
    assert h.link_source == "n/a" and "link bandwidth n/a" in h.findings()[1]
    with pytest.raises(ValueError):
        headroom(slab_bytes=0, slabs_per_step=1, decode_tok_s=1)


def test_from_the_telemetry_report():
    on = load_report(FIX / "full", ranks=2)
    h = headroom_from(on, decode_tok_s=26.8, acceptance=0.607, spec_k=4, link_gbs=22.74)
    assert isinstance(h, Headroom) and h.slabs_per_step == pytest.approx(MOVED) and h.slab_bytes == SLAB
    off = load_report(FIX / "prefetch_off", ranks=2)
    h_off = headroom_from(off, decode_tok_s=40.57, acceptance=0.54, spec_k=4, link_gbs=22.74)
    assert h_off.bytes_per_token < h.bytes_per_token          # prefetch off moves fewer bytes/token
    assert h_off.ceiling_tok_s > h.ceiling_tok_s
    assert headroom_from(None, decode_tok_s=1.0) is None
    assert headroom_from(on, decode_tok_s=None) is None
    no_steps = report_from_texts({"expert_cache_rank0.json": '{"totals": {"routed": 1}}'})
    assert headroom_from(no_steps, decode_tok_s=10.0, slab_bytes=SLAB) is None


# -- llama.cpp: the host memory-bandwidth roofline ---------------------------------------------------
def test_bytes_per_token_reads_active_experts_and_one_embedding_row():
    from arms.headroom import bytes_per_token

    tensors = [("token_embd.weight", 1000 * 64, 1000), ("output.weight", 64_000, 1000),
               ("blk.0.attn_q.weight", 4096, 64), ("blk.0.ffn_up_exps.weight", 32 * 1000, 1000)]
    assert bytes_per_token(tensors, n_expert=32, n_expert_used=4) == 64 + 64_000 + 4096 + 4 * 1000


def test_roofline_findings():
    from arms.headroom import Roofline

    r = Roofline(bytes_per_token=100_000_000, decode_tok_s=20.0, bandwidth_gbs=10.0, bandwidth_source="probe")
    assert r.ceiling_tok_s == pytest.approx(100.0) and r.reached == pytest.approx(0.2)
    assert r.effective_gbs == pytest.approx(2.0)
    assert "decode is 20 % of it" in r.findings()[1] and "(probe)" in r.findings()[1]
    assert "n/a" in Roofline(1, 1.0, None).findings()[0]


def test_the_moe_writer_and_the_gguf_reader_agree_on_bytes_per_token(tmp_path):
    import importlib.util

    from arms.headroom import bytes_per_token
    from host.membw import gguf_tensors
    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("make_moe_gguf", REPO / "scripts" / "make_moe_gguf.py")
    mod = importlib.util.module_from_spec(spec)
    import sys

    sys.modules["make_moe_gguf"] = mod          # dataclasses look their module up
    spec.loader.exec_module(mod)
    moe = mod.MoeSpec(layers=2, embd=128, ff=64, experts=8, used=2, dtype="f16")
    path = mod.write_moe_gguf(tmp_path / "m.gguf", moe)
    tensors, n_expert, n_used = gguf_tensors(path)
    assert (n_expert, n_used) == (8, 2)
    got = bytes_per_token(tensors, n_expert, n_used)
    experts_and_attention = moe.layers * (moe.used * moe.expert_bytes() + moe.attention_bytes())
    assert experts_and_attention < got < experts_and_attention + 200_000      # + output, router, norms
