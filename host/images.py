"""The images the tuner builds itself, without any registry (the simulated engine's,
host/simimage.py, and llama-server's, host/llamaimage.py): a root filesystem of host files,
built ``FROM scratch`` through podman-py against the podman API service, tagged with a hash of
its inputs so that unchanged inputs are never rebuilt, addressed by digest everywhere after;
and removing the superseded builds no container holds.

    rootfs:  copy_into, copy_libraries (what ``ldd`` names, the loader at /lib64 too), make_dirs
    build:   ensure_built(client, repo, input_hash, fill, containerfile, labels) -> Built
    prune:   labelled(client, label), remove_unused(client, images, what)
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("tuner.host.images")

# this module is part of every recipe: a change here changes the images built
RECIPE = Path(__file__).read_bytes()


# -- the root filesystem ------------------------------------------------------------------------
def ldd(path: Path) -> list[Path]:
    """The shared libraries the dynamic loader would load for ``path`` (``ldd``'s absolute paths)."""
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
        if m:
            libs.append(Path(m.group(1)))
    return libs


def copy_into(src: Path, root: Path, dest: str | None = None) -> None:
    """Copy ``src`` (links followed) into the root filesystem at ``dest``, else at its host path."""
    target = root / (dest or str(src)).lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, target, follow_symlinks=True)


def copy_libraries(libs: Iterable[Path], root: Path) -> None:
    """The shared libraries at their host paths, where the loader finds them; the loader itself
    also at /lib64 (the path written into the binaries)."""
    for lib in sorted(set(libs)):
        copy_into(lib, root)
        if "ld-linux" in lib.name:
            copy_into(lib, root, "/lib64/" + lib.name)


def make_dirs(root: Path, names: Iterable[str]) -> None:
    """Empty folders at the root; ``tmp`` (which should be one of them) sticky and world-writable."""
    for d in names:
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)


# -- the build ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Built:
    image: object    # the podman-py Image
    tag: str         # repo:input-hash
    ref: str         # repo@sha256:...
    built: bool      # False when an image with the same input hash already existed

    @property
    def size_bytes(self) -> int:
        return int(self.image.attrs.get("Size") or 0)


def find(client, tag: str):
    """The image tagged ``tag``, None when there is none."""
    from podman.errors import ImageNotFound

    try:
        return client.images.get(tag)
    except ImageNotFound:
        return None


def ensure_built(client, repo: str, input_hash: str, fill: Callable[[Path], None], containerfile: str,
                 labels: Mapping[str, str], *, rebuild: bool = False, prefix: str = "image-",
                 source: object = None, hint: str = "rebuild it") -> Built:
    """The image ``repo:input_hash``, built when missing (or ``rebuild``): ``fill(rootfs)`` writes
    the root filesystem into a fresh build context next to ``containerfile``. Tagged
    ``repo:latest`` too (campaign files may name the tag; ``check`` pins the digest). An image
    without a digest is a RuntimeError ending in ``hint``."""
    tag = f"{repo}:{input_hash}"
    img = None if rebuild else find(client, tag)
    built = False
    if img is None:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            ctx = Path(tmp)
            fill(ctx / "rootfs")
            (ctx / "Containerfile").write_text(containerfile)
            log.info("building %s from %s", tag, ctx if source is None else source)
            client.images.build(path=str(ctx), dockerfile="Containerfile", tag=tag, rm=True, pull=False,
                                labels=dict(labels))
        img = client.images.get(tag)
        built = True
    img.tag(repo, "latest")
    digest = img.attrs.get("Digest")
    if not digest:
        raise RuntimeError(f"image {tag} has no digest; {hint}")
    return Built(image=img, tag=tag, ref=f"{repo}@{digest}", built=built)


# -- pruning ------------------------------------------------------------------------------------


def labelled(client, label: str) -> list:
    """The images carrying ``label``; [] (logged) when podman cannot list them, e.g. while another
    client removes one mid-list ("retrieving size of image ...: image not known"): pruning is
    housekeeping and never fails a build."""
    from podman.errors import APIError

    try:
        return client.images.list(filters={"label": label})
    except APIError as e:
        log.info("not pruning superseded images this time: podman could not list them (%s)", e)
        return []


def remove_unused(client, images, what: str) -> tuple[str, ...]:
    """Remove each of ``images`` (podman-py Image objects) that no container, running or stopped,
    uses; one podman refuses (in use by now, a race) is kept and logged. ``what`` names them in
    the log ("simulated-engine"). Returns the tags (or short ids) removed."""
    from podman.errors import APIError

    removed: list[str] = []
    for img in images:
        name = img.tags or img.id[:12]
        if client.containers.list(all=True, filters={"ancestor": img.id}):
            log.info("keeping superseded %s: a container uses it", name)
            continue
        try:
            client.images.remove(img.id, force=False)
        except APIError as e:
            log.info("keeping superseded %s: %s", name, e)
            continue
        removed += img.tags or [img.id[:12]]
    if removed:
        log.info("pruned %d superseded %s image(s): %s", len(removed), what, ", ".join(removed))
    return tuple(removed)
