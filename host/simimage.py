"""Build the simulated engine's container image without any registry.

The image is a minimal root filesystem: the Python interpreter the tuner itself runs on
(binary, the shared libraries `ldd` names, a pruned standard library), the pure-Python part of
PyYAML (for landscape files) and the ``simengine`` package. It is built like every image the
tuner builds (host/images.py: ``FROM scratch`` + ``COPY`` through podman-py against the podman
API service), tagged with a hash of its inputs so an unchanged tree is never rebuilt, and
addressed by digest everywhere after.
"""
from __future__ import annotations

import hashlib
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from host.images import RECIPE, copy_into, copy_libraries, ensure_built, labelled, ldd, make_dirs, remove_unused

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
    h.update(RECIPE)                               # and the build every image shares
    for dest, src in input_files():
        h.update(dest.encode())
        h.update(src.read_bytes())
    return h.hexdigest()[:16]


def _build_rootfs(root: Path) -> None:
    exe = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    dynload = stdlib / "lib-dynload"
    copy_into(exe, root, "/usr/local/bin/python3")
    libs = set(ldd(exe))
    for so in sorted(dynload.glob("*.so")):
        if _DYNLOAD_SKIP.match(so.name):
            continue
        copy_into(so, root, f"/usr/local/lib/python3.11/lib-dynload/{so.name}")
        libs.update(ldd(so))
    copy_libraries(libs, root)
    for p in sorted(stdlib.rglob("*")):
        rel = p.relative_to(stdlib)
        if rel.parts and (rel.parts[0] in _STDLIB_SKIP or rel.parts[0] == "lib-dynload"):
            continue
        if p.is_file() and (p.suffix == ".py" or (p.suffix == ".pyc" and ".opt-" not in p.name)):
            copy_into(p, root, f"/usr/local/lib/python3.11/{rel}")
    for dest, src in input_files():
        copy_into(src, root, dest)
    make_dirs(root, ("tmp", "root", "models", "profiles"))


CONTAINERFILE = """FROM scratch
COPY rootfs/ /
ENV HOME=/root PYTHONPATH=/opt/simengine PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/usr/local/bin:/usr/bin:/bin
LABEL org.opencontainers.image.title=offload-tuner-simengine tuner.input-hash={h}
ENTRYPOINT ["/usr/local/bin/python3", "-m", "simengine", "serve"]
CMD ["/models/sim"]
"""


def ensure_image(client, rebuild: bool = False) -> SimImage:
    """Return the simulated-engine image for this tree, building it if needed."""
    h = input_hash()
    b = ensure_built(client, REPO, h, _build_rootfs, CONTAINERFILE.format(h=h), {"tuner.input-hash": h},
                     rebuild=rebuild, prefix="simimage-", hint="rebuild it with `tuner image --rebuild`")
    pruned = prune_superseded(client, keep_id=b.image.id) if b.built else ()
    return SimImage(ref=b.ref, image_id=b.image.id, tag=b.tag, built=b.built, size_bytes=b.size_bytes,
                    pruned=pruned)


def prune_superseded(client, keep_id: str) -> tuple[str, ...]:
    """Remove the simulated-engine images other than ``keep_id`` (one per source change or
    forced rebuild, ~70 MB each) that no container uses; an image a container still holds, or
    another build of the same sources, is left alone. Returns the tags (or short ids) removed."""
    mine = labelled(client, "tuner.input-hash")
    same = {(img.attrs.get("Labels") or {}).get("tuner.input-hash") for img in mine if img.id == keep_id}
    # another build of the same sources (a second tuner building at the same moment) is not superseded
    others = [img for img in mine if img.id != keep_id and (img.attrs.get("Labels") or {}).get("tuner.input-hash")
              not in same]
    return remove_unused(client, others, "simulated-engine")
