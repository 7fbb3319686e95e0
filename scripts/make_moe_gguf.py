"""Write a random-weight mixture-of-experts GGUF (qwen3moe) that llama.cpp's llama-server serves.

For the llama.cpp campaign (examples/llamacpp-cpu.yaml) the model must be big enough that
memory bandwidth and threads matter: every decoded token reads the active experts of every
layer (``used`` of ``experts``) plus attention, so decode speed is bounded by how fast the host
streams those bytes (the roofline in the morning report). The defaults give ~0.9 GB of weights,
~60 MB of them read per token. Seeded: the same arguments give the same bytes. Cached outside
the repository (``$OFFLOAD_TUNER_CACHE/models``, default /var/cache/offload-tuner/models);
an existing file is reused.

    python scripts/make_moe_gguf.py [--out PATH] [--layers 12 --embd 512 --ff 512 --experts 32 --used 4]

prints the file's path as the last line. The model (``MoeSpec``, ``write_moe_gguf``) is written
by tests/llamacpp_model.py's GGUF writer, the one that writes the tests' tiny models, with its
synthetic SentencePiece vocabulary (printable pieces only win the argmax).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.llamacpp_model import MoeSpec, write_moe_gguf  # noqa: E402  (the one GGUF writer)

__all__ = ["MoeSpec", "default_cache", "ensure_model", "write_moe_gguf"]


def default_cache() -> Path:
    return Path(os.environ.get("OFFLOAD_TUNER_CACHE", "/var/cache/offload-tuner")) / "models"


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
