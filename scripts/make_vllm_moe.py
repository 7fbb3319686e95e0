"""Write a tiny Qwen3-MoE model directory (Hugging Face layout) that the CPU build of vLLM serves.

Made here from a seed, nothing downloaded: ``config.json`` (Qwen3MoeForCausalLM: 4 layers,
8 experts, 2 active, hidden 256), ``model.safetensors`` (bf16, written with ``safetensors``) and
a byte-level BPE tokenizer trained with ``tokenizers`` on the short text below, so the same
arguments give the same bytes. The output head is a bigram table of that text (each token's
row points at the token that most often follows it there) and the blocks write little into the
residual stream, so greedy decoding recites word chains of the text: readable output, never
a token the tokenizer lacks (the rows past the tokenizer's size are zero).

Cached outside the repository (``$OFFLOAD_TUNER_CACHE/models``, default
/var/cache/offload-tuner/models); an existing directory is reused. ``tokenizers``,
``safetensors`` and ``numpy`` come from a small environment of their own under the cache
(``models/.venv``, made on first use), not the project's environment:

    python scripts/make_vllm_moe.py [--out DIR] [--layers 4 --hidden 256 --experts 8 --used 2 --seed 0]

prints the directory as the last line.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

RECIPE = 2          # bump when the bytes a spec gives change: the cached directory's name carries it
TOOLS = ("numpy>=1.26,<3", "tokenizers>=0.20,<1", "safetensors>=0.4,<1")

TEXT = """\
The tuner boots the engine, waits for it to be ready, and measures how fast it decodes.
Each night it tries one change at a time: a flag, a value, an environment variable.
When a change makes the engine faster and the quality guard holds, the change is kept.
When a change makes the engine fail, the log says why, and the night goes on.
The model is small and the weights are random, but the server is real and so is the log.
A mixture of experts sends every token to two of eight experts in each layer.
The cache holds the keys and the values of the tokens that came before.
In the morning the report shows what moved, what did not, and what broke.
"""


@dataclass(frozen=True)
class MoeSpec:
    layers: int = 4
    hidden: int = 256
    experts: int = 8
    used: int = 2
    expert_ff: int = 256          # moe_intermediate_size
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    vocab: int = 1024             # BPE target; the table is padded to a multiple of 64
    max_len: int = 4096           # max_position_embeddings
    seed: int = 0

    def name(self) -> str:
        return (f"qwen3moe-l{self.layers}-h{self.hidden}-x{self.experts}k{self.used}-"
                f"f{self.expert_ff}-v{self.vocab}-s{self.seed}-r{RECIPE}")


def default_cache() -> Path:
    return Path(os.environ.get("OFFLOAD_TUNER_CACHE", "/var/cache/offload-tuner")) / "models"


def _tools_python() -> Path:
    """The interpreter of the tools environment, made (pip, bounded ranges) when missing."""
    venv = default_cache() / ".venv"
    py = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *TOOLS], check=True)
        (venv / ".complete").touch()
    return py


def _have_tools() -> bool:
    try:
        import numpy  # noqa: F401
        import safetensors  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return True


def _tokenizer(spec: MoeSpec):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXT.splitlines(keepends=True), trainer=trainer)
    return tok


def write_model(out: Path, spec: MoeSpec = MoeSpec()) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(spec.seed)
    tok = _tokenizer(spec)
    n_tok = tok.get_vocab_size()
    vocab = -(-n_tok // 64) * 64
    ids = [i for line in TEXT.splitlines(keepends=True) for i in tok.encode(line).ids]

    def bf16(a):          # round to nearest bf16, stored as its 16 bits (numpy has no bfloat16)
        u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

    def mat(rows: int, cols: int, scale: float = 1.0):
        return rng.standard_normal((rows, cols), dtype=np.float32) * (scale / np.sqrt(cols))

    h, q, kv = spec.hidden, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    small = 0.05                                   # what the blocks add to the residual stream
    embed = rng.standard_normal((vocab, h), dtype=np.float32)
    follows = np.zeros((n_tok, n_tok), dtype=np.int32)
    for a, b in zip(ids, ids[1:]):
        follows[a, b] += 1
    head = np.zeros((vocab, h), dtype=np.float32)
    for a in range(n_tok):                         # a token the text never has points nowhere
        if follows[a].any():
            head[int(follows[a].argmax())] += embed[a] * (10.0 / h)   # logit ~10 for the successor
    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": embed, "model.norm.weight": np.ones(h),
                                "lm_head.weight": head}
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = np.ones(h)
        t[p + "post_attention_layernorm.weight"] = np.ones(h)
        t[p + "self_attn.q_proj.weight"] = mat(q, h)
        t[p + "self_attn.k_proj.weight"] = mat(kv, h)
        t[p + "self_attn.v_proj.weight"] = mat(kv, h)
        t[p + "self_attn.o_proj.weight"] = mat(h, q, small)
        t[p + "self_attn.q_norm.weight"] = np.ones(spec.head_dim)
        t[p + "self_attn.k_norm.weight"] = np.ones(spec.head_dim)
        t[p + "mlp.gate.weight"] = mat(spec.experts, h)
        for e in range(spec.experts):
            x = f"{p}mlp.experts.{e}."
            t[x + "gate_proj.weight"] = mat(spec.expert_ff, h)
            t[x + "up_proj.weight"] = mat(spec.expert_ff, h)
            t[x + "down_proj.weight"] = mat(h, spec.expert_ff, small)
    eos = tok.token_to_id("<|endoftext|>")
    config = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "vocab_size": vocab, "hidden_size": h, "intermediate_size": 2 * spec.expert_ff,
        "moe_intermediate_size": spec.expert_ff, "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads, "head_dim": spec.head_dim,
        "num_experts": spec.experts, "num_experts_per_tok": spec.used, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "norm_topk_prob": True, "output_router_logits": False,
        "router_aux_loss_coef": 0.001, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "max_position_embeddings": spec.max_len, "rope_theta": 10000.0, "rope_scaling": None,
        "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
        "sliding_window": None, "max_window_layers": spec.layers, "tie_word_embeddings": False,
        "initializer_range": 0.02, "use_cache": True, "torch_dtype": "bfloat16",
        "bos_token_id": eos, "eos_token_id": eos,
    }
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: bf16(v).view(np.uint16) for k, v in sorted(t.items())}, str(tmp / "model.safetensors"))
    _retype_bf16(tmp / "model.safetensors")
    os.chmod(tmp / "model.safetensors", 0o644)
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    (tmp / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": eos, "eos_token_id": eos, "do_sample": False}, indent=1) + "\n")
    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": spec.max_len,
        "bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}",
    }, indent=1, sort_keys=True) + "\n")
    (tmp / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}, indent=1) + "\n")
    (tmp / "offload-tuner.json").write_text(json.dumps({**asdict(spec), "tokens": n_tok, "vocab_size": vocab,
                                                        "parameters": int(sum(v.size for v in t.values()))},
                                                       indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def _retype_bf16(path: Path) -> None:
    """safetensors' numpy writer knows no bfloat16: the bf16 bits were written as U16; relabel
    them BF16 in a new header (data offsets count from the end of the header, so none moves)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    for name, meta in header.items():
        if name != "__metadata__":
            meta["dtype"] = "BF16"
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-len(text) % 8)                # the format pads the header to 8 bytes
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])


def digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def ensure_model(spec: MoeSpec = MoeSpec(), out: str | Path | None = None) -> Path:
    path = Path(out) if out else default_cache() / spec.name()
    return path if (path / "config.json").exists() else write_model(path, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    for field, default in asdict(MoeSpec()).items():
        p.add_argument(f"--{field.replace('_', '-')}", type=type(default), default=default)
    ns = p.parse_args(argv)
    if not _have_tools():          # re-run inside the tools environment
        py = _tools_python()
        return subprocess.run([str(py), str(Path(__file__).resolve()), *(sys.argv[1:] if argv is None else argv)]
                              ).returncode
    spec = MoeSpec(**{k: getattr(ns, k) for k in asdict(MoeSpec())})
    path = ensure_model(spec, ns.out)
    print(f"{spec.name()}: digest {digest(path)}", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
