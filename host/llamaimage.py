"""Build a llama.cpp ``llama-server`` container image locally, without any registry.

The image is the cached binary (scripts/build-llama-server.sh; CPU build, ggml and llama linked
statically) plus the shared libraries ``ldd`` names, ``FROM scratch``, built like every image
the tuner builds (host/images.py, as the simulated engine's, host/simimage.py). It is
tagged with a hash of its inputs (the binary's bytes and this recipe), so an unchanged binary is
never rebuilt, and campaigns address it by digest. Building a new one (a changed binary, or this
recipe) removes the older images built for the same repository (by their label), except one a
container still uses. No model is baked in: a campaign mounts the
GGUF read-only (a baseline ``model:`` that exists on the host is bind-mounted at the same path).

    python -m host.llamaimage [BINARY]     builds (or finds) it and prints the reference by digest
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from host.images import RECIPE, copy_into, copy_libraries, ensure_built, labelled, ldd, make_dirs, remove_unused

REPO = "localhost/offload-tuner-llama-server"
LABEL = "tuner.llama-input-hash"
REPO_LABEL = "tuner.llama-repo"
BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "build-llama-server.sh"

CONTAINERFILE = """FROM scratch
COPY rootfs/ /
ENV HOME=/root PATH=/usr/local/bin:/usr/bin:/bin
LABEL org.opencontainers.image.title=offload-tuner-llama-server {label}={h} {repo_label}={repo}
ENTRYPOINT ["/usr/local/bin/llama-server"]
"""


@dataclass(frozen=True)
class LlamaImage:
    ref: str        # localhost/offload-tuner-llama-server@sha256:...
    image_id: str
    tag: str
    built: bool
    size_bytes: int
    binary: str
    pruned: tuple[str, ...] = ()   # tags (or short ids) of the older builds removed after this one


def llama_server_binary() -> Path:
    """The cached llama-server, built first when missing (the script waits on its lock)."""
    r = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).splitlines()[-20:])
        raise RuntimeError(f"{BUILD_SCRIPT.name} failed (exit {r.returncode}):\n{tail}")
    return Path(r.stdout.strip().splitlines()[-1])


def input_hash(binary: Path) -> str:
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(RECIPE)                           # the build every image shares
    with open(binary, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def _build_rootfs(root: Path, binary: Path) -> None:
    copy_into(binary, root, "/usr/local/bin/llama-server")
    copy_libraries(ldd(binary), root)
    make_dirs(root, ("tmp", "root", "models"))


def ensure_image(client, binary: Path | None = None, rebuild: bool = False, repo: str = REPO) -> LlamaImage:
    """The llama-server image for this binary, built when missing; tagged ``:latest`` too. A
    build prunes the older builds of ``repo`` (``prune_superseded``)."""
    binary = Path(binary) if binary else llama_server_binary()
    h = input_hash(binary)
    b = ensure_built(client, repo, h, lambda root: _build_rootfs(root, binary),
                     CONTAINERFILE.format(label=LABEL, h=h, repo_label=REPO_LABEL, repo=repo),
                     {LABEL: h, REPO_LABEL: repo}, rebuild=rebuild, prefix="llamaimage-", source=binary)
    pruned = prune_superseded(client, b.image, repo) if b.built else ()
    return LlamaImage(ref=b.ref, image_id=b.image.id, tag=b.tag, built=b.built, size_bytes=b.size_bytes,
                      binary=str(binary), pruned=pruned)


def _ours(img, repo: str) -> bool:
    """An image this module built for ``repo``: its input-hash label, and its repository label
    (or, built before that label, a tag of the repository)."""
    labels = img.attrs.get("Labels") or {}
    if LABEL not in labels:
        return False
    if REPO_LABEL in labels:
        return labels[REPO_LABEL] == repo
    return any(t.rsplit(":", 1)[0] == repo for t in img.tags)


def _created(img) -> int:
    """An image's creation time in whole epoch seconds: the list gives seconds, inspect gives
    RFC 3339 with nanoseconds."""
    import datetime as dt

    value = img.attrs.get("Created") or 0
    if isinstance(value, (int, float)):
        return int(value)
    import re

    text = re.sub(r"\.\d+", "", str(value)).replace("Z", "+00:00")     # 3.11 reads no nanoseconds
    when = dt.datetime.fromisoformat(text)
    return int((when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp())


def prune_superseded(client, keep, repo: str = REPO) -> tuple[str, ...]:
    """Remove the llama-server images built for ``repo`` before ``keep`` (one per binary or
    recipe change, ~10 MB to ~100 MB each), never one a container (running or stopped) uses, nor
    a newer one (a concurrent build). Returns the tags (or short ids) removed."""
    created = _created(keep)
    older = [img for img in labelled(client, LABEL)
             if img.id != keep.id and _ours(img, repo) and _created(img) <= created]
    return remove_unused(client, older, "llama-server")


def main(argv: list[str] | None = None) -> int:
    from host.podman_host import PodmanHost

    args = sys.argv[1:] if argv is None else argv
    img = ensure_image(PodmanHost().client, Path(args[0]) if args else None)
    print(img.ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
