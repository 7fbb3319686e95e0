"""Build a llama.cpp ``llama-server`` container image locally, without any registry.

The image is the cached binary (scripts/build-llama-server.sh; CPU build, ggml and llama linked
statically) plus the shared libraries ``ldd`` names, ``FROM scratch``, built through podman-py
against the podman API service like the simulated engine's image (host/simimage.py). It is
tagged with a hash of its inputs (the binary's bytes and this recipe), so an unchanged binary is
never rebuilt, and campaigns address it by digest. Building a new one (a changed binary, or this
recipe) removes the older images built for the same repository (by their label), except one a
container still uses. No model is baked in: a campaign mounts the
GGUF read-only (a baseline ``model:`` that exists on the host is bind-mounted at the same path).

    python -m host.llamaimage [BINARY]     builds (or finds) it and prints the reference by digest
"""
from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from host.simimage import _copy, _ldd, _lookup

log = logging.getLogger("tuner.host.llamaimage")

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
    with open(binary, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def _build_rootfs(root: Path, binary: Path) -> None:
    _copy(binary, root, "/usr/local/bin/llama-server")
    for lib in sorted(set(_ldd(binary))):
        _copy(lib, root)                       # the loader finds them at their host paths
        if "ld-linux" in lib.name:
            _copy(lib, root, "/lib64/" + lib.name)
    for d in ("tmp", "root", "models"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)


def ensure_image(client, binary: Path | None = None, rebuild: bool = False, repo: str = REPO) -> LlamaImage:
    """The llama-server image for this binary, built when missing; tagged ``:latest`` too. A
    build prunes the older builds of ``repo`` (``prune_superseded``)."""
    binary = Path(binary) if binary else llama_server_binary()
    h = input_hash(binary)
    tag = f"{repo}:{h}"
    img = None if rebuild else _lookup(client, tag)
    built = False
    if img is None:
        with tempfile.TemporaryDirectory(prefix="llamaimage-") as tmp:
            ctx = Path(tmp)
            _build_rootfs(ctx / "rootfs", binary)
            (ctx / "Containerfile").write_text(CONTAINERFILE.format(label=LABEL, h=h, repo_label=REPO_LABEL,
                                                                    repo=repo))
            log.info("building %s from %s", tag, binary)
            client.images.build(path=str(ctx), dockerfile="Containerfile", tag=tag, rm=True, pull=False,
                                labels={LABEL: h, REPO_LABEL: repo})
        img = client.images.get(tag)
        built = True
    img.tag(repo, "latest")
    digest = img.attrs.get("Digest")
    if not digest:
        raise RuntimeError(f"image {tag} has no digest; rebuild it")
    pruned = prune_superseded(client, img, repo) if built else ()
    return LlamaImage(ref=f"{repo}@{digest}", image_id=img.id, tag=tag, built=built,
                      size_bytes=int(img.attrs.get("Size") or 0), binary=str(binary), pruned=pruned)


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
    from host.images import labelled, remove_unused

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
