"""Random-weight GGUF models that llama.cpp's llama-server loads and serves: one writer.

Two models, written by one GGUF writer (``_write``: the vocabulary, the header, the tensor
layout) with two recipes for the random numbers (``_TinyWeights``, ``_MoeWeights``):

* ``write_tiny_gguf``: the tests' tiny llama or qwen3moe (deep and narrow, ~1.5 MB);
* ``write_moe_gguf`` / ``MoeSpec``: a qwen3moe big enough that memory bandwidth and threads
  matter, for the llama.cpp campaign (scripts/make_moe_gguf.py caches one outside the repo).

Written with gguf-py from a seeded numpy generator, so the same arguments give the same
bytes. Vocab: a synthetic SentencePiece (SPM) one: <unk>, <s>, </s>, the 256 byte tokens
<0x00>..<0xFF> (byte fallback, so any prompt tokenizes) and a few hundred ASCII pieces.
The output rows of the special and byte tokens are zero while the pieces' rows are random, so
greedy decoding always picks a printable piece: every generated token streams as text at once
(a lone byte token of a multi-byte UTF-8 sequence would be held back by the server).
Shapes follow the reference notes (engine-interface.md section D); numpy shapes are ggml's
`ne` reversed.
"""
from __future__ import annotations

import json
import string
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

SPECIALS = ["<unk>", "<s>", "</s>"]
WORDS = ("the of and to in is was for on that with as by at from it this be are or an "
         "which not have one had but were all they their has been more can two other new "
         "time first will after when there about also into some would only over such like "
         "model server token expert cache layer decode prompt tune offload batch thread").split()


def _vocab() -> tuple[list[str], list[float], list[int]]:
    from gguf import TokenType

    tokens = list(SPECIALS)
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256
    pieces = ["\u2581"] + list(string.ascii_letters + string.digits + string.punctuation)
    pieces += ["\u2581" + c for c in string.ascii_lowercase] + ["\u2581" + w for w in WORDS]
    pieces += [w for w in WORDS if len(w) > 1]
    seen: set[str] = set()
    pieces = [p for p in pieces if not (p in seen or seen.add(p))]
    tokens += pieces
    types += [TokenType.NORMAL] * len(pieces)
    # SPM merges toward the highest score: longer pieces win
    scores = [0.0] * (3 + 256) + [float(len(p)) - 10.0 for p in pieces]
    return tokens, scores, [int(t) for t in types]


# -- the layout and the writer -------------------------------------------------------------------
@dataclass(frozen=True)
class _Layout:
    arch: str                   # llama (dense) | qwen3moe
    title: str
    file_type: str              # f16 | q8_0 | q4_0
    context: int
    layers: int
    embd: int
    ff: int                     # the dense feed-forward length, or per expert
    heads: int
    head_dim: int
    kv_heads: int
    experts: int = 0
    used: int = 0


def _write(path: Path, lay: _Layout, weights) -> Path:
    """The GGUF of ``lay`` with ``weights``' numbers, written to ``path`` through a ``.part`` file.
    ``weights`` draws in the order the tensors are written (its generator's state is the model)."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tokens, scores, types = _vocab()
    n_vocab, e = len(tokens), lay.embd
    w = gguf.GGUFWriter(str(tmp), lay.arch)
    w.add_name(lay.title)
    w.add_file_type({"f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                     "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[lay.file_type])
    w.add_context_length(lay.context)
    w.add_embedding_length(e)
    w.add_block_count(lay.layers)
    w.add_head_count(lay.heads)
    w.add_head_count_kv(lay.kv_heads)
    w.add_key_length(lay.head_dim)
    w.add_value_length(lay.head_dim)
    w.add_rope_dimension_count(lay.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if lay.experts:
        w.add_expert_count(lay.experts)
        w.add_expert_used_count(lay.used)
        w.add_expert_feed_forward_length(lay.ff)
    else:
        w.add_feed_forward_length(lay.ff)
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
    embd = weights.embedding(n_vocab, e)
    add("token_embd.weight", (embd, None))
    add("output_norm.weight", ones(e))
    out = weights.output(n_vocab, e, embd)
    out[: 3 + 256] = 0.0          # specials and byte tokens never win the argmax
    add("output.weight", (out, None))
    q, kv = lay.heads * lay.head_dim, lay.kv_heads * lay.head_dim
    for i in range(lay.layers):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", ones(e))
        add(b + "ffn_norm.weight", ones(e))
        add(b + "attn_q.weight", weights.matrix(q, e))
        add(b + "attn_k.weight", weights.matrix(kv, e))
        add(b + "attn_v.weight", weights.matrix(kv, e))
        add(b + "attn_output.weight", weights.matrix(e, q, residual=True))
        if not lay.experts:
            add(b + "ffn_gate.weight", weights.matrix(lay.ff, e))
            add(b + "ffn_up.weight", weights.matrix(lay.ff, e))
            add(b + "ffn_down.weight", weights.matrix(e, lay.ff))
            continue
        add(b + "attn_q_norm.weight", ones(lay.head_dim))
        add(b + "attn_k_norm.weight", ones(lay.head_dim))
        add(b + "ffn_gate_inp.weight", (weights.router(lay.experts, e), None))
        add(b + "ffn_gate_exps.weight", weights.matrix(lay.experts, lay.ff, e))
        add(b + "ffn_up_exps.weight", weights.matrix(lay.experts, lay.ff, e))
        add(b + "ffn_down_exps.weight", weights.matrix(lay.experts, e, lay.ff, residual=True))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path


# -- the tests' tiny model -----------------------------------------------------------------------
class _TinyWeights:
    """Every matrix f16 from float64 draws, scaled by 1/sqrt(fan-in); the output head x4."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def _rand(self, *shape: int) -> np.ndarray:  # matrices in f16 (norms stay f32): half the bytes
        return (self.rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float16)

    def embedding(self, *shape: int) -> np.ndarray:
        return self._rand(*shape)

    def output(self, n_vocab: int, embd: int, embedding) -> np.ndarray:
        return self._rand(n_vocab, embd) * np.float16(4.0)

    def matrix(self, *shape: int, residual: bool = False):
        return self._rand(*shape), None

    def router(self, *shape: int) -> np.ndarray:
        return self._rand(*shape)


def write_tiny_gguf(path: str | Path, arch: str = "llama", *, n_layer: int | None = None,
                    n_embd: int = 32, n_ff: int = 32, seed: int = 0) -> Path:
    """Write the model to `path` and return it. `arch` is "llama" or "qwen3moe".

    Deep and narrow on purpose: llama.cpp's CPU cost per decode step is mostly a fixed ~17 us
    per layer of graph work, so 96 thin layers (default for llama; ~1.5 MB in f16) take ~1.5 ms
    a token on one thread, slow enough to time over HTTP; qwen3moe defaults to 32 layers."""
    if arch not in ("llama", "qwen3moe"):
        raise ValueError(f"arch must be 'llama' or 'qwen3moe', not {arch!r}")
    if n_layer is None:
        n_layer = 96 if arch == "llama" else 32
    moe = arch == "qwen3moe"
    lay = _Layout(arch, f"offload-tuner tiny {arch}", "f16", 4096, n_layer, n_embd, n_ff, heads=n_embd // 32,
                  head_dim=32, kv_heads=1, experts=4 if moe else 0, used=2 if moe else 0)
    return _write(Path(path), lay, _TinyWeights(seed))


# -- the campaign's MoE --------------------------------------------------------------------------
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


class _MoeWeights:
    """Matrices from float32 draws, scaled by 1/sqrt(fan-in), in ``dtype`` (quantized for q8_0 and
    q4_0); the embedding /8; an f32 router. ``echo``: the output head is the embedding and what
    the blocks add to the residual stream is x0.05."""

    def __init__(self, spec: MoeSpec) -> None:
        import gguf

        self.rng = np.random.default_rng(spec.seed)
        self.echo = spec.echo
        self.qtype = {"f16": None, "q8_0": gguf.GGMLQuantizationType.Q8_0,
                      "q4_0": gguf.GGMLQuantizationType.Q4_0}[spec.dtype]

    def embedding(self, *shape: int) -> np.ndarray:
        return self.rng.standard_normal(shape).astype(np.float16) / 8

    def output(self, n_vocab: int, embd: int, embedding) -> np.ndarray:
        out = (self.rng.standard_normal((n_vocab, embd)) / np.sqrt(embd) * 4).astype(np.float16)
        if self.echo:
            out = (embedding.astype(np.float32) * 8 / np.sqrt(embd) * 4).astype(np.float16)
        return out

    def matrix(self, *shape: int, residual: bool = False):
        import gguf

        scale = 0.05 if residual and self.echo else 1.0
        a = (self.rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])) * scale
        if self.qtype is None:
            return a.astype(np.float16), None
        return gguf.quants.quantize(a, self.qtype), self.qtype

    def router(self, *shape: int) -> np.ndarray:
        return self.rng.standard_normal(shape).astype(np.float32)


def write_moe_gguf(path: str | Path, spec: MoeSpec = MoeSpec()) -> Path:
    """The campaign-sized MoE at ``path``, and its sizes beside it (``.json``)."""
    lay = _Layout("qwen3moe", "offload-tuner random MoE", spec.dtype, 8192, spec.layers, spec.embd, spec.ff,
                  spec.heads, spec.head_dim, spec.kv_heads, spec.experts, spec.used)
    path = _write(Path(path), lay, _MoeWeights(spec))
    path.with_suffix(".json").write_text(json.dumps({**asdict(spec), "bytes_per_token": spec.bytes_per_token(),
                                                     "weight_bytes": spec.total_bytes()}, indent=1))
    return path
