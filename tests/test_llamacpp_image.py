"""The llama-server image: a build for a changed binary removes the older builds it superseded
(host/llamaimage.py prune_superseded), never one a container uses. On a real podman service.

The images here live in a repository of their own (``repo=``), so that pruning touches nothing
a concurrent campaign or test runs from the shipped repository.
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from host.llamaimage import LABEL, ensure_image, llama_server_binary
from tests.llamacpp_model import write_tiny_gguf

pytestmark = pytest.mark.podman


def _variant(tmp_path: Path, real: Path, n: int) -> Path:
    """The real binary with a few bytes appended: it runs the same, but its hash (and so its
    image) is another one, as after a rebuild."""
    out = tmp_path / f"llama-server-{n}"
    out.write_bytes(real.read_bytes() + f"\0variant {n} {uuid.uuid4()}".encode())
    os.chmod(out, 0o755)
    return out


def _exists(client, ref: str) -> bool:
    from podman.errors import ImageNotFound

    try:
        client.images.get(ref)
        return True
    except ImageNotFound:
        return False


def test_a_new_build_prunes_the_older_ones_but_not_one_a_container_runs(podman_host, tmp_path):
    client = podman_host.client
    repo = f"localhost/offload-tuner-llama-prunetest-{uuid.uuid4().hex[:8]}"
    real = llama_server_binary()
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    bins = [_variant(tmp_path, real, n) for n in range(3)]
    container = None
    try:
        first = ensure_image(client, bins[0], repo=repo)
        assert first.built and first.pruned == ()
        assert client.images.get(first.ref).labels[LABEL]
        # a container runs the first build: llama-server serving the tiny model
        container = client.containers.create(
            first.ref, command=["-m", "/m/tiny.gguf", "--port", "18599", "-t", "1", "-c", "256"],
            mounts=[{"type": "bind", "source": str(model), "target": "/m/tiny.gguf", "read_only": True}],
            network_mode="none", name=f"llama-prunetest-{uuid.uuid4().hex[:8]}")
        container.start()
        time.sleep(1.0)
        container.reload()
        assert container.status == "running", container.logs()

        second = ensure_image(client, bins[1], repo=repo)
        assert second.built and second.pruned == ()          # the first is in use: kept
        assert _exists(client, first.ref) and _exists(client, second.ref)
        again = ensure_image(client, bins[1], repo=repo)      # found, not built: prunes nothing
        assert not again.built and again.pruned == () and again.ref == second.ref

        container.stop(timeout=5)
        container.remove()
        container = None
        third = ensure_image(client, bins[2], repo=repo)
        assert third.built
        assert set(third.pruned) == {first.tag, second.tag}
        assert not _exists(client, first.ref) and not _exists(client, second.ref)
        assert _exists(client, third.ref)
        assert client.images.get(f"{repo}:latest").id == third.image_id
    finally:
        if container is not None:
            container.remove(force=True)
        for img in client.images.list(filters={"label": LABEL}):
            if any(t.startswith(repo + ":") for t in img.tags):
                client.images.remove(img.id, force=True)
