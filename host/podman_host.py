"""The real `Host`: podman-py against a `podman system service` socket (rootful or rootless).

The socket comes from the campaign's ``podman:`` key, else ``CONTAINER_HOST``, else podman-py's
default (``$XDG_RUNTIME_DIR/podman/podman.sock``). The client carries no global timeout: an
idle followed log stream must not raise (podman-py applies the client timeout to every read).
"""
from __future__ import annotations

import io
import logging
import os
import tarfile
import threading
import time
from pathlib import Path

from arms.errors import ConfigError, HostError
from arms.host import LABEL_MANAGED, RealTime, ContainerSpec, ContainerState, ImageInfo, LogFollower
from host.systemd import Systemctl

log = logging.getLogger("tuner.host.podman")


LINE_CAP = 64 * 1024     # bytes of a line never ended (a progress bar's carriage returns) held before it is written


def socket_url(explicit: str | None = None) -> str | None:
    return explicit or os.environ.get("CONTAINER_HOST") or None


def whole_lines(rest: bytes, frame: bytes) -> tuple[bytes, bytes]:
    """(the whole lines, each ending in its newline, and what is left of a line not ended yet) of
    ``rest`` + ``frame``. A log frame is a piece of the stream, not a line: podman sends a line
    written in pieces, or one longer than its 8 KiB buffer, as several frames, and a newline put
    after each frame cut such a line in two (a boot log's ``n_ctx = 1024`` read as two lines
    neither parser rule matched; a secret split across two frames escaped its redaction). A line
    left open past ``LINE_CAP`` is written as it is."""
    data = rest + frame
    cut = data.rfind(b"\n") + 1
    if len(data) - cut > LINE_CAP:
        return data + b"\n", b""
    return data[:cut], data[cut:]


class PodmanHost(RealTime, Systemctl):
    def __init__(self, url: str | None = None):
        from podman import PodmanClient

        self.url = socket_url(url)
        try:
            self.client = PodmanClient(base_url=self.url) if self.url else PodmanClient()
            self.client.ping()
        except Exception as e:  # noqa: BLE001 - any failure here means "no service"
            where = self.url or "the default podman socket"
            raise ConfigError(
                f"podman API service at {where} does not answer ({type(e).__name__}); start one with "
                "`podman system service --time=0 unix:///PATH/podman.sock` and set CONTAINER_HOST or `podman:`"
            ) from None

    # -- images --------------------------------------------------------------------------
    def resolve_image(self, ref: str) -> ImageInfo:
        from podman.errors import ImageNotFound

        try:
            img = self.client.images.get(ref)
        except ImageNotFound:
            raise ConfigError(f"image {ref} is not present on this host; pull or build it first "
                            f"(`podman pull {ref}`)") from None
        digest = img.attrs.get("Digest") or ""
        repo = ref.split("@", 1)[0]
        if ":" in repo.rsplit("/", 1)[-1]:
            repo = repo.rsplit(":", 1)[0]
        pinned = None
        for rd in img.attrs.get("RepoDigests") or []:
            if rd.split("@", 1)[0] == repo:
                pinned = rd
                break
        if "@sha256:" in ref:
            pinned = ref
            digest = ref.split("@", 1)[1]
        if pinned is None:
            if not digest:
                raise HostError(f"image {ref} has no digest; push or re-tag it so podman records one")
            pinned = f"{repo}@{digest}"
        return ImageInfo(ref=pinned, digest=digest, image_id=img.id, tags=tuple(img.tags))

    # -- containers ----------------------------------------------------------------------
    def start(self, spec: ContainerSpec) -> str:
        from podman.errors import APIError, ImageNotFound

        kwargs = dict(
            command=list(spec.command), name=spec.name, environment=dict(spec.env),
            labels=dict(spec.labels), network_mode=spec.network_mode,
            mounts=[{"type": "bind", "source": m.source, "target": m.target, "read_only": m.read_only}
                    for m in spec.mounts],
            log_config={"Type": "k8s-file"},
        )
        if spec.devices:
            kwargs["devices"] = list(spec.devices)
        if spec.ipc_mode:
            kwargs["ipc_mode"] = spec.ipc_mode
        if spec.ulimits:
            kwargs["ulimits"] = [{"Name": n, "Soft": s, "Hard": h} for n, s, h in spec.ulimits]
        if spec.shm_size:
            kwargs["shm_size"] = spec.shm_size
        if spec.group_add:
            kwargs["group_add"] = list(spec.group_add)
        try:
            ctr = self.client.containers.create(spec.image, **kwargs)
        except ImageNotFound:
            raise HostError(f"image {spec.image} is not present on this host") from None
        except APIError as e:
            raise HostError(f"podman refused to create {spec.name}: {e.explanation or e}") from None
        try:
            ctr.start()
        except APIError as e:
            self.remove(ctr.id)
            raise HostError(f"podman could not start {spec.name}: {e.explanation or e}") from None
        log.debug("started %s (%s)", spec.name, ctr.id[:12])
        return ctr.id

    def _get(self, cid: str):
        from podman.errors import APIError, NotFound

        try:
            return self.client.containers.get(cid)
        except NotFound:
            return None
        except APIError as e:     # podman 4.3 answers a container removed mid-call with 500 "no such container"
            if "no such container" in str(e).lower():
                return None
            raise

    def follow_logs(self, cid: str, path: Path, redact=None) -> LogFollower:
        """Copy the log as it grows, whole lines only (``whole_lines``: podman sends one line as
        several frames); re-open a stream that ends while the container still runs (podman can
        close a follow stream opened in the first instants of a container), and on ``stop``
        resync the file from podman's whole log so no line is ever missing."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        ctr = self._get(cid)
        lock = threading.Lock()
        box = {"closed": False, "frames": 0, "rest": b""}

        def sealed(chunk: bytes) -> bytes:
            return redact(chunk.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape") if redact else chunk

        def pump() -> None:
            with open(path, "ab", buffering=0) as f:
                while ctr is not None and not box["closed"]:
                    seen = 0
                    try:
                        for frame in ctr.logs(stream=True, follow=True):
                            seen += 1
                            if seen <= box["frames"]:
                                continue          # a re-opened stream replays from the start
                            with lock:
                                if box["closed"]:
                                    return
                                lines, box["rest"] = whole_lines(box["rest"], frame)
                                if lines:
                                    f.write(sealed(lines))
                                box["frames"] += 1
                    except Exception as e:  # noqa: BLE001 - the stream ends when the container goes
                        log.debug("log stream of %s ended: %s", cid[:12], e)
                    if not self.state(cid).running:
                        with lock:
                            if not box["closed"] and box["rest"]:
                                f.write(sealed(box["rest"] + b"\n"))     # its last line, never ended
                                box["rest"] = b""
                        return
                    time.sleep(0.2)

        t = threading.Thread(target=pump, name=f"logs-{cid[:12]}", daemon=True)
        t.start()

        def _stop(timeout: float = 2.0) -> None:
            t.join(timeout)
            with lock:
                box["closed"] = True
                c = self._get(cid)
                if c is None:
                    return
                try:
                    whole = b"".join(c.logs(stream=False))
                except Exception as e:  # noqa: BLE001 - keep what the stream copied
                    log.debug("final log read of %s failed: %s", cid[:12], e)
                    return
                whole = sealed(whole if not whole or whole.endswith(b"\n") else whole + b"\n")
                if len(whole) >= (path.stat().st_size if path.exists() else 0):
                    path.write_bytes(whole)

        return LogFollower(path=path, stop=_stop)

    def state(self, cid: str) -> ContainerState:
        ctr = self._get(cid)
        if ctr is None:
            return ContainerState(status="missing")
        st = ctr.attrs.get("State") or {}
        if isinstance(st, str):   # sparse list() objects carry a string
            ctr.reload()
            st = ctr.attrs.get("State") or {}
        status = str(st.get("Status", "unknown")).lower()
        code = st.get("ExitCode")
        return ContainerState(status=status, exit_code=int(code) if code is not None and status != "running" else None,
                              oom_killed=bool(st.get("OOMKilled")), pid=st.get("Pid") or None)

    def wait(self, cid: str, timeout: float) -> ContainerState:
        from podman.errors import APIError

        ctr = self._get(cid)
        if ctr is None:
            return ContainerState(status="missing")
        try:
            ctr.wait(condition=["exited", "stopped"], timeout=max(1, int(timeout)))
        except APIError:
            pass    # timed out: the state says it is still running
        return self.state(cid)

    def kill(self, cid: str, signal: str = "SIGKILL") -> None:
        from podman.errors import APIError

        ctr = self._get(cid)
        if ctr is not None:
            try:
                ctr.kill(signal=signal)
            except APIError as e:
                log.debug("kill %s: %s", cid[:12], e)

    def copy_out(self, cid: str, src: str, dest: Path) -> list[Path]:
        from podman.errors import APIError, NotFound

        ctr = self._get(cid)
        if ctr is None:
            raise HostError(f"container {cid[:12]} is gone; cannot copy {src} out of it")
        try:
            chunks, _stat = ctr.get_archive(src)
        except (NotFound, APIError) as e:
            raise HostError(f"{src} not found in container {cid[:12]}: {getattr(e, 'explanation', e)}") from None
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        out = []
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tf:
            for m in tf.getmembers():
                if not m.isfile():
                    continue
                name = Path(m.name)
                if name.is_absolute() or ".." in name.parts:
                    continue
                target = dest / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tf.extractfile(m).read())
                out.append(target)
        return out

    def remove(self, cid: str) -> None:
        from podman.errors import APIError, NotFound

        ctr = self._get(cid)
        if ctr is None:
            return
        try:
            ctr.remove(force=True)
        except NotFound:
            pass
        except APIError as e:
            raise HostError(f"podman could not remove {cid[:12]}: {e.explanation or e}") from None

    def inspect_container(self, name: str) -> dict | None:
        """``podman inspect`` of a container by name or id, as plain data; None when there is none."""
        from podman.errors import NotFound

        try:
            return self.client.containers.get(name).attrs
        except NotFound:
            return None

    def default_ulimits(self, image: str) -> dict[str, int]:
        """The soft nofile/nproc limits this podman service gives a container of ``image`` that
        asks for none (containers.conf's ``default_ulimits``, whichever file the service read): a
        throwaway container is created (never started), read and removed."""
        import uuid

        from arms.lifecycle import ulimits_of

        ctr = self.client.containers.create(image, command=["true"], name=f"offload-tuner-ulimits-{uuid.uuid4().hex[:8]}")
        try:
            got = ulimits_of((ctr.attrs.get("HostConfig") or {}).get("Ulimits"))
        finally:
            self.remove(ctr.id)
        return {k: v for k, v in got.items() if k in ("nofile", "nproc")}

    def inspect_image(self, ref: str) -> dict:
        """``podman image inspect`` of an image by reference or id, as plain data."""
        return self.client.images.get(ref).attrs

    def probes(self, cid: str, interval_s: float = 2.0):
        """The real machine's probes around one arm (``host.probes.ProbeSampler``)."""
        from host.probes import for_container

        return for_container(self, cid, interval_s=interval_s)

    def conditions(self, cid: str):
        """The real box around each run: foreign CPU load, load average, CPU frequency, GPU
        clocks and holders (``host.conditions.BoxConditions``)."""
        from host.conditions import for_container

        return for_container(self, cid)

    def rest_load(self, seconds: float = 2.0) -> dict:
        """Other processes' CPU load on the box before the night's first boot (``host.conditions``)."""
        from host.conditions import read_rest_load

        return read_rest_load(seconds)

    def list_managed(self, labels: dict[str, str] | None = None) -> list[tuple[str, dict[str, str]]]:
        filters = [f"label={LABEL_MANAGED}=1"] + [f"label={k}={v}" for k, v in (labels or {}).items()]
        return [(c.id, dict(c.labels or {})) for c in self.client.containers.list(all=True, filters=filters)]

    def simulated_engine_image(self, rebuild: bool = False):
        """The simulated engine's image on this service, built from the sources when missing
        (host.simimage.SimImage; `tuner image`)."""
        from host.simimage import ensure_image

        return ensure_image(self.client, rebuild=rebuild)

    def warm_files(self, paths: list[str], budget_s: float) -> dict:
        from host.pagecache import read_through

        return read_through(paths, budget_s)

    def gpu_holders(self) -> list[tuple[int, str, int]] | None:
        from host.probes import gpu_holders

        return gpu_holders()

    def podman_version(self) -> str | None:
        """The API service's podman version (the units are written for the podman that runs them)."""
        try:
            return str(self.client.version()["Version"])
        except Exception:  # noqa: BLE001 - a service that cannot say: ask the binary
            return Systemctl.podman_version(self)

    def port_holder(self, port: int) -> str | None:
        from .ports import ancestry, describe_pid, listener_pid

        pid = listener_pid(port)
        if pid is None:
            return None
        if pid is True:
            return "an unknown process (not visible to this user)"
        family = ancestry(pid)
        try:
            for c in self.client.containers.list():
                if (c.attrs.get("Pid") or (c.attrs.get("State") or {}).get("Pid")) in family:
                    return f"container {c.name} ({c.id[:12]}), {describe_pid(pid)}"
        except Exception as e:        # podman answered badly: the pid alone still names the holder
            log.debug("container list for the port holder failed: %s", e)
        return describe_pid(pid)
