"""A tiny random-weight GGUF model that llama.cpp's llama-server loads and serves.

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

import string
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


def write_tiny_gguf(path: str | Path, arch: str = "llama", *, n_layer: int | None = None,
                    n_embd: int = 32, n_ff: int = 32, seed: int = 0) -> Path:
    """Write the model to `path` and return it. `arch` is "llama" or "qwen3moe".

    Deep and narrow on purpose: llama.cpp's CPU cost per decode step is mostly a fixed ~17 us
    per layer of graph work, so 96 thin layers (default for llama; ~1.5 MB in f16) take ~1.5 ms
    a token on one thread, slow enough to time over HTTP; qwen3moe defaults to 32 layers."""
    import gguf

    if arch not in ("llama", "qwen3moe"):
        raise ValueError(f"arch must be 'llama' or 'qwen3moe', not {arch!r}")
    if n_layer is None:
        n_layer = 96 if arch == "llama" else 32
    path = Path(path)
    rng = np.random.default_rng(seed)
    head_dim = 32
    n_head, n_head_kv = n_embd // head_dim, 1
    n_expert, n_expert_used = 4, 2
    tokens, scores, types = _vocab()
    n_vocab = len(tokens)

    def rand(*shape: int) -> np.ndarray:  # matrices in f16 (norms stay f32): half the bytes
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float16)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"offload-tuner tiny {arch}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if arch == "llama":
        w.add_feed_forward_length(n_ff)
    else:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
        w.add_expert_feed_forward_length(n_ff)
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

    ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", rand(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", ones(n_embd))
    out = rand(n_vocab, n_embd) * np.float16(4.0)
    out[: 3 + 256] = 0.0  # specials and byte tokens never win the argmax
    w.add_tensor("output.weight", out)
    q, kv = n_head * head_dim, n_head_kv * head_dim
    for i in range(n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones(n_embd))
        w.add_tensor(b + "ffn_norm.weight", ones(n_embd))
        w.add_tensor(b + "attn_q.weight", rand(q, n_embd))
        w.add_tensor(b + "attn_k.weight", rand(kv, n_embd))
        w.add_tensor(b + "attn_v.weight", rand(kv, n_embd))
        w.add_tensor(b + "attn_output.weight", rand(n_embd, q))
        if arch == "llama":
            w.add_tensor(b + "ffn_gate.weight", rand(n_ff, n_embd))
            w.add_tensor(b + "ffn_up.weight", rand(n_ff, n_embd))
            w.add_tensor(b + "ffn_down.weight", rand(n_embd, n_ff))
        else:
            w.add_tensor(b + "attn_q_norm.weight", ones(head_dim))
            w.add_tensor(b + "attn_k_norm.weight", ones(head_dim))
            w.add_tensor(b + "ffn_gate_inp.weight", rand(n_expert, n_embd))
            w.add_tensor(b + "ffn_gate_exps.weight", rand(n_expert, n_ff, n_embd))
            w.add_tensor(b + "ffn_up_exps.weight", rand(n_expert, n_ff, n_embd))
            w.add_tensor(b + "ffn_down_exps.weight", rand(n_expert, n_embd, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
