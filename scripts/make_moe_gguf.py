"""Write a random-weight mixture-of-experts GGUF (qwen3moe) that llama.cpp's llama-server serves.

For the llama.cpp campaign (examples/llamacpp-cpu.yaml) the model must be big enough that
memory bandwidth and threads matter: every decoded token reads the active experts of every
layer (``used`` of ``experts``) plus attention, so decode speed is bounded by how fast the host
streams those bytes (the roofline in the morning report). The defaults give ~0.9 GB of weights,
~60 MB of them read per token. Seeded: the same arguments give the same bytes. Cached outside
the repository (``$OFFLOAD_TUNER_CACHE/models``, default /var/cache/offload-tuner/models);
an existing file is reused.

    python scripts/make_moe_gguf.py [--out PATH] [--layers 12 --embd 512 --ff 512 --experts 32 --used 4]

prints the file's path as the last line. The vocabulary is tests/llamacpp_model.py's synthetic
SentencePiece one (printable pieces only win the argmax).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class MoeSpec:
    layers: int = 12
    embd: int = 512
    ff: int = 512               # per expert
    experts: int = 32
    used: int = 4
    head_dim: int = 64
    kv_heads: int = 2
    dtype: str = "f16"          # f16 | q8_0 | q4_0 (expert and attention matrices)
    seed: int = 0
    # echo: the output head is the token embedding and the blocks write little into the residual
    # stream, so greedy decoding repeats the prompt's last token: a text that n-gram drafts
    # (--spec-type ngram-*) predict in full, as for the repetitive outputs they are made for
    echo: bool = False

    @property
    def heads(self) -> int:
        return max(1, self.embd // self.head_dim)

    def expert_bytes(self) -> int:
        """Bytes of one expert (gate, up, down) in one layer."""
        return 3 * self.embd * self.ff * _bytes_per_weight(self.dtype)

    def attention_bytes(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return (2 * q * self.embd + 2 * kv * self.embd) * _bytes_per_weight(self.dtype)

    def bytes_per_token(self) -> int:
        """Weight bytes one decoded token reads: active experts + attention + router, every layer."""
        router = self.experts * self.embd * 4
        return self.layers * (self.used * self.expert_bytes() + self.attention_bytes() + router)

    def total_bytes(self) -> int:
        return self.layers * (self.experts * self.expert_bytes() + self.attention_bytes())

    def name(self) -> str:
        return (f"moe-l{self.layers}-e{self.embd}-f{self.ff}-x{self.experts}k{self.used}-"
                f"{self.dtype}-s{self.seed}{'-echo' if self.echo else ''}.gguf")


def _bytes_per_weight(dtype: str) -> float:
    return {"f16": 2, "q8_0": 34 / 32, "q4_0": 18 / 32}[dtype]


def default_cache() -> Path:
    return Path(os.environ.get("OFFLOAD_TUNER_CACHE", "/var/cache/offload-tuner")) / "models"


def write_moe_gguf(path: str | Path, spec: MoeSpec = MoeSpec()) -> Path:
    import gguf

    sys.path.insert(0, str(REPO))
    from tests.llamacpp_model import _vocab

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    rng = np.random.default_rng(spec.seed)
    qtype = {"f16": None, "q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}[spec.dtype]

    def mat(*shape: int, scale: float = 1.0):
        a = (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])) * scale
        if qtype is None:
            return a.astype(np.float16), None
        return gguf.quants.quantize(a, qtype), qtype

    tokens, scores, types = _vocab()
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(str(tmp), "qwen3moe")
    w.add_name("offload-tuner random MoE")
    w.add_file_type({"f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                     "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[spec.dtype])
    w.add_context_length(8192)
    w.add_embedding_length(spec.embd)
    w.add_block_count(spec.layers)
    w.add_head_count(spec.heads)
    w.add_head_count_kv(spec.kv_heads)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(spec.experts)
    w.add_expert_used_count(spec.used)
    w.add_expert_feed_forward_length(spec.ff)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    def add(name: str, pair) -> None:
        data, raw = pair
        w.add_tensor(name, data, raw_dtype=raw)

    ones = lambda n: (np.ones(n, dtype=np.float32), None)  # noqa: E731
    embd = rng.standard_normal((n_vocab, spec.embd)).astype(np.float16) / 8
    add("token_embd.weight", (embd, None))
    add("output_norm.weight", ones(spec.embd))
    out = (rng.standard_normal((n_vocab, spec.embd)) / np.sqrt(spec.embd) * 4).astype(np.float16)
    if spec.echo:
        out = (embd.astype(np.float32) * 8 / np.sqrt(spec.embd) * 4).astype(np.float16)
    small = 0.05 if spec.echo else 1.0          # what the blocks add to the residual stream
    out[: 3 + 256] = 0.0          # specials and byte tokens never win the argmax
    add("output.weight", (out, None))
    q, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    for i in range(spec.layers):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", ones(spec.embd))
        add(b + "ffn_norm.weight", ones(spec.embd))
        add(b + "attn_q.weight", mat(q, spec.embd))
        add(b + "attn_k.weight", mat(kv, spec.embd))
        add(b + "attn_v.weight", mat(kv, spec.embd))
        add(b + "attn_output.weight", mat(spec.embd, q, scale=small))
        add(b + "attn_q_norm.weight", ones(spec.head_dim))
        add(b + "attn_k_norm.weight", ones(spec.head_dim))
        add(b + "ffn_gate_inp.weight", (rng.standard_normal((spec.experts, spec.embd)).astype(np.float32), None))
        add(b + "ffn_gate_exps.weight", mat(spec.experts, spec.ff, spec.embd))
        add(b + "ffn_up_exps.weight", mat(spec.experts, spec.ff, spec.embd))
        add(b + "ffn_down_exps.weight", mat(spec.experts, spec.embd, spec.ff, scale=small))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    path.with_suffix(".json").write_text(json.dumps({**asdict(spec), "bytes_per_token": spec.bytes_per_token(),
                                                     "weight_bytes": spec.total_bytes()}, indent=1))
    return path


def ensure_model(spec: MoeSpec = MoeSpec(), out: str | Path | None = None) -> Path:
    path = Path(out) if out else default_cache() / spec.name()
    return path if path.exists() else write_moe_gguf(path, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    for field, default in asdict(MoeSpec()).items():
        if isinstance(default, bool):
            p.add_argument(f"--{field.replace('_', '-')}", action="store_true")
        else:
            p.add_argument(f"--{field.replace('_', '-')}", type=type(default), default=default)
    ns = p.parse_args(argv)
    spec = MoeSpec(**{k: getattr(ns, k) for k in asdict(MoeSpec())})
    path = ensure_model(spec, ns.out)
    print(f"{spec.total_bytes() / 1e6:.0f} MB of weights, {spec.bytes_per_token() / 1e6:.1f} MB read per token",
          file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
