"""A simulated container's file system: bind mounts over a writable layer over the image.

A container path under a mount's target is the host path under its source (a mounted compile
cache persists from boot to boot, a mounted landscape is read from the host); any other write
lands in the container's scratch folder (its writable layer, removed with it); reads fall
through to the image's files, which are the simengine and yaml packages (``host.simimage``).
"""
from __future__ import annotations

import posixpath
import shutil
from collections.abc import Callable
from pathlib import Path

from arms.host import BindMount


def norm(cpath: str) -> str:
    return posixpath.normpath("/" + str(cpath).lstrip("/"))


class ContainerFS:
    def __init__(self, mounts: tuple[BindMount, ...], scratch: Path,
                 image: Callable[[], dict[str, Path]]):
        self.mounts = sorted(mounts, key=lambda m: len(norm(m.target)), reverse=True)
        self.scratch, self._image = Path(scratch), image

    def mount_of(self, cpath: str) -> BindMount | None:
        p = norm(cpath)
        for m in self.mounts:
            t = norm(m.target)
            if p == t or p.startswith(t.rstrip("/") + "/"):
                return m
        return None

    def read_only(self, cpath: str) -> bool:
        m = self.mount_of(cpath)
        return bool(m and m.read_only)

    def write_path(self, cpath: str) -> Path:
        p = norm(cpath)
        m = self.mount_of(p)
        if m is not None:
            rel = p[len(norm(m.target)):].lstrip("/")
            return Path(m.source) / rel if rel else Path(m.source)
        return self.scratch / p.lstrip("/")

    def read_path(self, cpath: str) -> Path:
        """Mounts shadow the writable layer, which shadows the image."""
        w = self.write_path(cpath)
        if self.mount_of(cpath) is not None or w.exists():
            return w
        return self._image().get(norm(cpath), w)

    def copy_out(self, src: str, dest: Path) -> list[Path]:
        """Copy a file (as ``dest/<name>``) or a folder (as ``dest/<name>/...``) out, like
        ``podman cp``; an empty list when ``src`` does not exist."""
        p, hits = norm(src), {}
        base = posixpath.basename(p)
        layers = [] if self.mount_of(p) else [(k, v) for k, v in self._image().items()
                                              if k == p or k.startswith(p + "/")]
        w = self.write_path(p)
        if w.is_file():
            layers.append((p, w))
        elif w.is_dir():
            layers += [(p + "/" + f.relative_to(w).as_posix(), f) for f in w.rglob("*") if f.is_file()]
        for k, v in layers:                             # later layers shadow earlier ones
            hits[base if k == p else posixpath.join(base, k[len(p) + 1:])] = v
        out = []
        for rel, srcfile in hits.items():
            target = Path(dest) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(srcfile, target)
            out.append(target)
        return out

    def remove(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)
