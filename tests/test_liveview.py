"""The night on screen: in a real terminal (tmux), every log line of a night is in the scrollback
exactly once and one live header (incumbent, objective, deadline, ETA, the arm and its phase)
stays below them; without a terminal the same words go to sd_notify STATUS, with WATCHDOG=1
while the arms run."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid

import yaml

from tests.report_journals import REPO

ARMS = 8


def campaign(tmp_path, name) -> str:
    c = yaml.safe_load((REPO / "examples" / "sim-campaign.yaml").read_text())
    c["name"], c["journal"] = name, str(tmp_path / "journal")
    c["baseline"]["compile_cache"] = str(tmp_path / "cc")
    c["budget"] = {"max_arms": ARMS}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return str(path)


def test_log_scrolls_once_under_one_header_in_tmux(tmp_path):
    assert shutil.which("tmux"), "scripts/test.sh installs tmux"
    path, done = campaign(tmp_path, "live-tmux"), tmp_path / "done"
    gate, stream = tmp_path / "gate", tmp_path / "stream"
    session = f"tuner-live-{uuid.uuid4().hex[:8]}"
    # the night waits for the gate, so every byte it draws goes through pipe-pane into `stream`
    cmd = (f"while [ ! -e {gate} ]; do sleep 0.05; done; cd {REPO} && "
           f"{sys.executable} -m tuner.cli run {path} --simulated; echo $? > {done}; sleep 60")
    subprocess.run(["tmux", "new-session", "-d", "-x", "110", "-y", "24", "-s", session, cmd], check=True)
    try:
        subprocess.run(["tmux", "pipe-pane", "-o", "-t", session, f"cat >> {stream}"], check=True)
        gate.touch()
        deadline = time.monotonic() + 240
        while not done.exists():
            assert time.monotonic() < deadline, "the night did not end"
            time.sleep(0.2)
        assert done.read_text().strip() == "0"
        while "campaign END" not in stream.read_text(errors="replace"):    # pipe-pane's cat catches up
            assert time.monotonic() < deadline, "the pane's stream never showed the night's end"
            time.sleep(0.1)
        out = subprocess.run(["tmux", "capture-pane", "-p", "-J", "-S", "-5000", "-t", session],
                             capture_output=True, text=True).stdout
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    lines = out.splitlines()
    for n in range(ARMS):
        assert sum(f"[arm {n} START " in x for x in lines) == 1, f"arm {n} START:\n{out}"
        assert sum(f"[arm {n} VERDICT " in x for x in lines) == 1, f"arm {n} VERDICT:\n{out}"
    assert sum("[campaign END]" in x for x in lines) == 1
    # one header, at the bottom, not a copy per redraw
    headers = [i for i, x in enumerate(lines) if x.startswith("live-tmux · ")]
    assert len(headers) == 1, out
    h = lines[headers[0]:headers[0] + 3]
    assert h[1].startswith("decode_geomean ") and "vs baseline) · incumbent: " in h[1]
    assert h[2].startswith("elapsed ") and "deadline " in h[2] and "ETA in " in h[2] and "arms left" in h[2]
    assert max(len(x) for x in h) <= 110
    assert headers[0] > max(i for i, x in enumerate(lines) if "[arm " in x)     # below every log line
    # while it ran, the header said the arm and its phase (every frame drawn is in the pane's stream)
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>78]", "\n", stream.read_text(errors="replace"))
    mid = [x.strip() for x in re.split(r"[\r\n]+", drawn)
           if re.search(r"live-tmux · arm \d+ \w+: .* — (confirming: )?(booting|measuring|verdict|between|telemetry)", x)]
    assert mid, "the header never named the arm and its phase while the night ran"
    assert any(re.search(r"ETA in ", x) for x in re.split(r"[\r\n]+", drawn)), "no ETA was ever drawn"


def test_sd_notify_status_and_watchdog_without_a_terminal(tmp_path):
    sock_path = str(tmp_path / "notify.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(sock_path)
    srv.settimeout(0.2)
    env = {**os.environ, "NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "100000"}   # a tick every 0.05 s
    p = subprocess.Popen([sys.executable, "-m", "tuner.cli", "run", campaign(tmp_path, "live-notify"), "--simulated",
                          "--quiet"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got: list[str] = []
    try:
        while p.poll() is None or True:
            try:
                got.append(srv.recv(65536).decode())
            except socket.timeout:
                if p.poll() is not None:
                    break
    finally:
        p.wait(timeout=240)
        srv.close()
    assert p.returncode == 0, p.stderr[-2000:]
    statuses = [m[len("STATUS="):] for m in got if m.startswith("STATUS=")]
    assert got[0] == "READY=1" and got.count("WATCHDOG=1") >= ARMS
    # the arm's phase reaches systemd (at most one STATUS per 2 s of wall time: which phases get
    # through depends on the machine's speed, so any one of them will do)
    assert any(re.search(r" — (booting|measuring depth \d+)", s) for s in statuses), statuses
    last = statuses[-1]
    assert last.startswith("live-notify · arm ") and "incumbent: " in last and "ETA " in last
    assert not (tmp_path / "journal" / "live-notify" / "phase.json").exists()   # removed when the night ends


def test_status_reads_the_phase_of_a_running_night(tmp_path):
    import json

    from tests.report_journals import simulated_night

    folder = simulated_night(tmp_path, arms=4)
    (folder / "phase.json").write_text(json.dumps({"arm": 3, "phase": "measuring depth 1087"}))
    (folder / "daemon.pid").write_text(str(os.getpid()))                # "alive": this process
    r = subprocess.run([sys.executable, "-m", "tuner.cli", "status", str(folder), "--json"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    d = json.loads(r.stdout)
    assert d["phase"] == "measuring depth 1087"
