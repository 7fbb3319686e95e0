"""`tuner dashboard`: optuna-dashboard on a campaign's Optuna study, bound to 127.0.0.1 only."""
from __future__ import annotations

import errno
import socket
from pathlib import Path

from arms.errors import ConfigError

HOST = "127.0.0.1"


def study_path(folder: str | Path) -> Path | str:
    """The study's journal file, or a shared campaign's database URL (optuna-dashboard opens it)."""
    from tuner.night.readback import _URLS, campaign_folder, shared_of

    folder = campaign_folder(folder)
    mark = shared_of(folder)
    if mark is not None and not (folder / "optuna.journal").exists():
        return _URLS.get(folder.resolve()) or mark["storage"]
    path = folder / "optuna.journal"
    if not path.exists():
        raise ConfigError(f"{path} does not exist: the campaign has not asked Optuna for an arm yet")
    return path


def storage(path: Path | str):
    """Optuna's storage of the study: the journal file, or the shared campaign's database (opened
    as the night opens it, tuner.night.study.open_storage)."""
    from tuner.night.storage import open_storage

    return open_storage(path)


def _port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError as e:
            why = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be bound ({e.strerror})"
            raise ConfigError(f"--port {port}: {HOST}:{port} {why}; pass another --port") from None


def serve(folder: str | Path, port: int = 8080) -> None:
    """Block serving the dashboard until interrupted."""
    try:
        from optuna_dashboard import run_server
    except ImportError:
        raise ConfigError("tuner dashboard needs optuna-dashboard: pip install optuna-dashboard "
                          "(or pip install 'offload-tuner[report]')") from None
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port}: give a TCP port in 1..65535")
    path = study_path(folder)
    _port_free(port)
    from tuner.night.storage import safe_url

    shown = safe_url(path) if isinstance(path, str) else path      # a URL's password is never printed
    print(f"optuna-dashboard for {shown} on http://{HOST}:{port}/ (Ctrl-C stops it)", flush=True)
    run_server(storage(path), host=HOST, port=port)
