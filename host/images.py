"""Removing images the tuner built and no longer needs (one concept: never one a container holds)."""
from __future__ import annotations

import logging

log = logging.getLogger("tuner.host.images")


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
