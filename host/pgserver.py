"""A private PostgreSQL server for a shared campaign's tests, benches and demo: Debian's
``postgresql`` binaries, a data directory of its own, loopback TCP on a free port and a socket
in that directory, password authentication (scram-sha-256) for one role. Started and stopped
by whoever needs it (as scripts/podman-service.sh starts podman); nothing global is touched.

PostgreSQL refuses to run as root: as root the server runs as the ``postgres`` user Debian's
package creates (``runuser``), and the data directory is made over to it.

    with PgServer(Path("/tmp/pg")) as pg:
        url = pg.url            # postgresql://tuner:...@127.0.0.1:PORT/tuner
        pg.restart()            # pg_ctl restart: what a daemon must ride out mid-night
"""
from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

from arms.errors import HostError

ROLE = "tuner"
DATABASE = "tuner"


def bindir() -> Path:
    """Where Debian's PostgreSQL binaries are (the newest installed major), or HostError."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    which = shutil.which("pg_ctl")
    if which:
        return Path(os.path.realpath(which)).parent
    raise HostError("no PostgreSQL server binaries (pg_ctl) found: install Debian's package "
                    "(apt-get install postgresql) — scripts/test.sh does")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """``with PgServer(folder):`` a running server; ``url`` (with the password), ``safe_url`` (without)."""

    def __init__(self, folder: Path, port: int | None = None, password: str | None = None):
        self.folder = Path(folder)
        self.data = self.folder / "data"
        self.port = port or free_port()
        self.password = password or secrets.token_hex(12)
        self.bin = bindir()
        self._as = None
        if os.geteuid() == 0:
            try:
                self._as = pwd.getpwnam("postgres")
            except KeyError:
                raise HostError("running as root, and there is no `postgres` user to run the server as "
                                "(Debian's postgresql package creates it)") from None

    @property
    def url(self) -> str:
        return f"postgresql://{ROLE}:{self.password}@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def safe_url(self) -> str:
        return f"postgresql://{ROLE}@127.0.0.1:{self.port}/{DATABASE}"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / argv[0]), *argv[1:]]
        if self._as is not None:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        got = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/")
        if check and got.returncode != 0:
            tail = (got.stderr or got.stdout).strip().splitlines()[-1:] or [""]
            raise HostError(f"{argv[0]} failed ({got.returncode}): {tail[0]}")
        return got

    def _own(self, path: Path) -> None:
        if self._as is not None:
            os.chown(path, self._as.pw_uid, self._as.pw_gid)

    def init(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._own(self.folder)
        if (self.data / "PG_VERSION").exists():
            return
        pwfile = self.folder / "pwfile"
        pwfile.write_text(self.password + "\n")
        os.chmod(pwfile, 0o600)
        self._own(pwfile)
        try:
            self._run("initdb", "-D", str(self.data), "-U", ROLE, "--pwfile", str(pwfile),
                      "--auth-local=scram-sha-256", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync")
        finally:
            pwfile.unlink(missing_ok=True)
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                    f"unix_socket_directories = '{self.folder}'\nfsync = on\nmax_connections = 100\n")

    def start(self) -> "PgServer":
        self.init()
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.folder / "server.log"), "-w", "-t", "60", "start")
        self._wait()
        self._create_database()
        return self

    def _wait(self, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self._run("pg_isready", "-h", "127.0.0.1", "-p", str(self.port), check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise HostError(f"PostgreSQL on port {self.port} did not accept connections in {timeout:.0f} s "
                        f"(its log: {self.folder / 'server.log'})")

    def _create_database(self) -> None:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=ROLE, password=self.password,
                                dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
            if cur.fetchone() is None:
                cur.execute(f"CREATE DATABASE {DATABASE}")
        conn.close()

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    def restart(self) -> None:
        """``pg_ctl restart`` (fast: open connections are cut, as a real restart does)."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.folder / "server.log"), "-m", "fast", "-w",
                  "restart")
        self._wait()

    def __enter__(self) -> "PgServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":            # python -m host.pgserver FOLDER: a server for a by-hand shared campaign
    import sys

    srv = PgServer(Path(sys.argv[1] if len(sys.argv) > 1 else ".run/pg"))
    srv.start()
    print(srv.url)
