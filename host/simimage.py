"""Build the simulated engine's container image without any registry.

The image is a minimal root filesystem: the Python interpreter the tuner itself runs on
(binary, the shared libraries `ldd` names, a pruned standard library), the pure-Python part of
PyYAML (for landscape files) and the ``simengine`` package. It is built through podman-py
(``FROM scratch`` + ``COPY``) against the podman API service, tagged with a hash of its
inputs so an unchanged tree is never rebuilt, and addressed by digest everywhere after.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("tuner.host.simimage")

REPO = "localhost/offload-tuner-simengine"
# Parts of the standard library an HTTP server written with the stdlib never imports.
_STDLIB_SKIP = {
    "test", "site-packages", "dist-packages", "idlelib", "tkinter", "turtledemo", "ensurepip",
    "lib2to3", "pydoc_data", "unittest", "distutils", "venv", "sqlite3", "curses", "dbm",
    "xmlrpc", "config-3.11-x86_64-linux-gnu",
}
_DYNLOAD_SKIP = re.compile(r"^(_tkinter|_test|_ctypes_test|_xxtestfuzz|_sqlite3|_curses|_dbm|_gdbm|xxlimited|_testcapi|_testinternalcapi|_testbuffer|_testimportmultiple|_testmultiphase)")


@dataclass(frozen=True)
class SimImage:
    ref: str      # "localhost/offload-tuner-simengine@sha256:..."
    image_id: str
    tag: str
    built: bool   # False when an image with the same input hash already existed
    size_bytes: int
    pruned: tuple[str, ...] = ()   # tags of superseded builds removed after this one was built


def _ldd(path: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
        if m:
            libs.append(Path(m.group(1)))
    return libs


def _copy(src: Path, root: Path, dest: str | None = None) -> None:
    target = root / (dest or str(src)).lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, target, follow_symlinks=True)


def _package_dir(name: str) -> Path:
    mod = __import__(name)
    return Path(mod.__file__).parent


def input_files() -> list[tuple[str, Path]]:
    """(path inside the image, host path) of every input that changes the image."""
    files: list[tuple[str, Path]] = []
    for pkg, dest in (("simengine", "/opt/simengine/simengine"), ("yaml", "/opt/simengine/yaml")):
        base = _package_dir(pkg)
        for p in sorted(base.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".so", ".pyc"):
                files.append((f"{dest}/{p.relative_to(base)}", p))
    return files


def input_hash() -> str:
    h = hashlib.sha256(sys.version.encode())
    h.update(Path(__file__).read_bytes())          # the recipe itself
    for dest, src in input_files():
        h.update(dest.encode())
        h.update(src.read_bytes())
    return h.hexdigest()[:16]


def _build_rootfs(root: Path) -> None:
    exe = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    dynload = stdlib / "lib-dynload"
    _copy(exe, root, "/usr/local/bin/python3")
    libs = set(_ldd(exe))
    for so in sorted(dynload.glob("*.so")):
        if _DYNLOAD_SKIP.match(so.name):
            continue
        _copy(so, root, f"/usr/local/lib/python3.11/lib-dynload/{so.name}")
        libs.update(_ldd(so))
    for lib in sorted(libs):
        _copy(lib, root)                      # keeps the host path: the loader finds it there
        if "ld-linux" in lib.name:
            _copy(lib, root, "/lib64/" + lib.name)
    for p in sorted(stdlib.rglob("*")):
        rel = p.relative_to(stdlib)
        if rel.parts and (rel.parts[0] in _STDLIB_SKIP or rel.parts[0] == "lib-dynload"):
            continue
        if p.is_file() and (p.suffix == ".py" or (p.suffix == ".pyc" and ".opt-" not in p.name)):
            _copy(p, root, f"/usr/local/lib/python3.11/{rel}")
    for dest, src in input_files():
        _copy(src, root, dest)
    for d in ("tmp", "root", "models", "profiles"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)


CONTAINERFILE = """FROM scratch
COPY rootfs/ /
ENV HOME=/root PYTHONPATH=/opt/simengine PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/usr/local/bin:/usr/bin:/bin
LABEL org.opencontainers.image.title=offload-tuner-simengine tuner.input-hash={h}
ENTRYPOINT ["/usr/local/bin/python3", "-m", "simengine", "serve"]
CMD ["/models/sim"]
"""


def _lookup(client, tag: str):
    from podman.errors import ImageNotFound

    try:
        return client.images.get(tag)
    except ImageNotFound:
        return None


def ensure_image(client, rebuild: bool = False) -> SimImage:
    """Return the simulated-engine image for this tree, building it if needed."""
    h = input_hash()
    tag = f"{REPO}:{h}"
    img = None if rebuild else _lookup(client, tag)
    built = False
    if img is None:
        with tempfile.TemporaryDirectory(prefix="simimage-") as tmp:
            ctx = Path(tmp)
            _build_rootfs(ctx / "rootfs")
            (ctx / "Containerfile").write_text(CONTAINERFILE.format(h=h))
            log.info("building %s from %s", tag, ctx)
            img, _logs = client.images.build(
                path=str(ctx), dockerfile="Containerfile", tag=tag, rm=True, pull=False,
                labels={"tuner.input-hash": h},
            )
        img = client.images.get(tag)
        built = True
    img.tag(REPO, "latest")        # campaign files may name the tag; `check` pins the digest
    digest = img.attrs.get("Digest")
    if not digest:
        raise RuntimeError(f"image {tag} has no digest; rebuild it with `tuner image --rebuild`")
    pruned = prune_superseded(client, keep_id=img.id) if built else ()
    return SimImage(ref=f"{REPO}@{digest}", image_id=img.id, tag=tag, built=built,
                    size_bytes=int(img.attrs.get("Size") or 0), pruned=pruned)


def prune_superseded(client, keep_id: str) -> tuple[str, ...]:
    """Remove the simulated-engine images other than ``keep_id`` (one per source change or
    forced rebuild, ~70 MB each) that no container uses; an image a container still holds, or
    another build of the same sources, is left alone. Returns the tags (or short ids) removed."""
    from host.images import labelled, remove_unused

    mine = labelled(client, "tuner.input-hash")
    same = {(img.attrs.get("Labels") or {}).get("tuner.input-hash") for img in mine if img.id == keep_id}
    # another build of the same sources (a second tuner building at the same moment) is not superseded
    others = [img for img in mine if img.id != keep_id and (img.attrs.get("Labels") or {}).get("tuner.input-hash")
              not in same]
    return remove_unused(client, others, "simulated-engine")
