"""The overnight campaign end to end on the real podman service with the simulated engine
(fast landscape: the default one with boots x0.002 and decode x8), and crash-resume."""
from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from arms.host import LABEL_CAMPAIGN
from simengine import planner
from simengine.cli import build_parser, known_flags, shape_values
from simengine.landscape import load_landscape
from tests.conftest import REPO, free_port, sigterm_once_booting

pytestmark = pytest.mark.podman

BASE_ARGS = {"tensor-parallel-size": 2, "max-model-len": 32768, "gpu-memory-utilization": 0.98,
             "kv-cache-memory-bytes": 2147483648, "max-num-seqs": 4, "enable-prefix-caching": True,
             "speculative-config": {"method": "mtp", "num_speculative_tokens": 4}, "expert-prefetch": 1}
BASE_ENV = {"R4D_LRU_GATHER_CHUNKS": 8, "R4D_LRU_GATHER_LANES": 16, "SIMENGINE_TIME_SCALE": 0.002,
            "SIMENGINE_DECODE_SCALE": 8, "SIMENGINE_NOISE": 0}
LEVERS = {
    "expert-prefetch": ["absent", 1],
    "speculative-config": ["absent", {"method": "mtp", "num_speculative_tokens": 4}],
    "env.R4D_LRU_GATHER_CHUNKS": [8, 32],
    "env.R4D_LRU_GATHER_LANES": [16, 64],
    "max-num-seqs": [2, 4],
    "gpu-memory-utilization": [0.98, 0.99],
    "env.CLAV_TUNABLEOP_WITH_OFFLOAD": {"values": ["absent", 1], "numerics": "changing"},
}
DEPTHS = [166, 1087]


def campaign(tmp_path, sim_image, name, levers=LEVERS, **extra) -> str:
    data = {"name": name, "engine": "simengine",
            "baseline": {"image": sim_image.tag, "model": "/models/sim", "args": BASE_ARGS, "env": BASE_ENV,
                         "compile_cache": str(tmp_path / "cache"), "port": free_port()},
            "levers": levers, "measure": {"depths": DEPTHS, "runs": 2, "warm_tokens": 16, "max_tokens": 64,
                                          "quiet_wait_s": 0},     # a loaded CI box: no wait for quiet
            "boot": {"timeout_s": 60, "hang_s": 30, "poll_s": 0.2}, "journal": str(tmp_path / "journal"), **extra}
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(p)


def tuner(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def records(tmp_path, name):
    path = tmp_path / "journal" / name / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def best_reachable_objective() -> float:
    """The true optimum over every combination of the lever values (landscape arithmetic)."""
    parser = build_parser()
    land = load_landscape(None, known_flags(parser))
    best = 0.0
    names = list(LEVERS)
    values = [v if isinstance(v, list) else v["values"] for v in LEVERS.values()]
    for combo in itertools.product(*values):
        args, env = dict(BASE_ARGS), {k: str(v) for k, v in BASE_ENV.items()}
        for n, v in zip(names, combo):
            if n.startswith("env."):
                if v == "absent":
                    env.pop(n[4:], None)
                else:
                    env[n[4:]] = str(v)
            elif v == "absent":
                args.pop(n, None)
            else:
                args[n] = v
        if args["max-num-seqs"] == 2 or args["gpu-memory-utilization"] == 0.99 or "CLAV_TUNABLEOP_WITH_OFFLOAD" in env:
            continue        # fails to boot or corrupts
        argv = ["serve", "/m"] + [x for k, v in args.items() for x in
                                  ([f"--{k}"] if v is True else [f"--{k}", json.dumps(v) if isinstance(v, dict) else str(v)])]
        vals = shape_values(parser.parse_args(argv), parser, env)
        rates = planner.decode_rates(land, vals, planner.make_plan(land, vals))
        geo = (rates[166] * rates[1087]) ** 0.5
        best = max(best, geo)
    return best * 8        # decode scale


def test_campaign_finds_the_best_reachable_shape_and_journals_every_arm(tmp_path, sim_image, podman_host):
    path = campaign(tmp_path, sim_image, "e2e")
    r = tuner("run", path, "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    recs = records(tmp_path, "e2e")
    starts = [x for x in recs if x["op"] == "arm_start"]
    ends = {x["arm"]: x for x in recs if x["op"] == "arm_end"}
    assert len(starts) >= 12 and sorted(ends) == [x["arm"] for x in starts]
    verdicts = {e["verdict"] for e in ends.values()}
    assert "boot-failed:constraint-violation" in verdicts          # max-num-seqs 2
    assert "boot-failed:insufficient-memory-for-utilization" in verdicts   # util 0.99
    assert "corrupt" in verdicts                                   # TunableOp with offload
    moves = [x for x in recs if x["op"] == "incumbent"]
    assert len(moves) >= 3
    final = moves[-1]
    assert final["score"]["objective"] == pytest.approx(best_reachable_objective(), rel=0.03)
    env = dict(final["shape"]["env"])
    assert "expert-prefetch" not in dict(final["shape"]["args"])
    assert env.get("R4D_LRU_GATHER_CHUNKS") == "32" and env.get("R4D_LRU_GATHER_LANES") == "64"
    for arm in ends.values():
        assert (tmp_path / "journal" / "e2e" / "arms" / f"{arm['arm']:04d}" / "boot.log").exists()
    assert podman_host.list_managed({LABEL_CAMPAIGN: "e2e"}) == []
    st = tuner("status", path, "--json")
    assert json.loads(st.stdout)["arms"] == len(starts)
    # the Optuna study agrees with the journal, and opens with the storage class the dashboard uses
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(tmp_path / "journal" / "e2e" / "optuna.journal")))
    import optuna

    trials = optuna.load_study(study_name="e2e", storage=storage).get_trials()
    assert len(trials) == len(starts) and all(t.state.is_finished() for t in trials)


# arm 0 baseline, 1 recheck, 2 the prefetch-off probe (better), 3 its confirmation, then the recheck that
# brackets them and moves the incumbent (``incumbent:*``: the first move, wherever it falls), probes
# where a container is in flight (the resume must find and remove it): on podman, here; the points
# between arms (ended:2, told:2, ended:3, incumbent:*, asked:4) are journal and study only and run
# the same assertions on the simulated host (tests/test_crash_resume.py)
CRASH_POINTS = ["started:0", "container-started:0", "booted:2", "measuring:2", "booted:3", "container-started:5"]
SMALL = {"expert-prefetch": ["absent", 1], "max-num-seqs": [2, 4], "gpu-memory-utilization": [0.98, 0.99]}


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_kill_9_anywhere_resumes_with_nothing_lost_or_duplicated(tmp_path, sim_image, podman_host, point):
    name = "crash-" + point.replace(":", "-").replace("*", "first")
    path = campaign(tmp_path, sim_image, name, levers=SMALL, budget={"max_arms": 7})   # the last point is arm 5
    first = tuner("run", path, "--quiet", env={"TUNER_CRASH_AT": point})
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    second = tuner("run", path, "--quiet")
    assert second.returncode == 0, second.stderr[-3000:]
    assert_resumed_whole(tmp_path, name)
    assert podman_host.list_managed({LABEL_CAMPAIGN: name}) == []           # no orphan


def assert_resumed_whole(tmp_path, name):
    """After a kill -9 and a resume: every arm started once and ended once, every trial told and
    finished, and the night still reached the landscape's right incumbent (prefetch off)."""
    recs = records(tmp_path, name)
    starts = [x["arm"] for x in recs if x["op"] == "arm_start"]
    ends = [x["arm"] for x in recs if x["op"] == "arm_end"]
    assert starts == sorted(set(starts)) == list(range(len(starts)))        # none duplicated, none skipped
    assert sorted(ends) == starts                                           # none lost: every arm has its end
    told = [x["arm"] for x in recs if x["op"] == "told"]
    assert sorted(told) == starts
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    study = optuna.load_study(study_name=name, storage=JournalStorage(
        JournalFileBackend(str(tmp_path / "journal" / name / "optuna.journal"))))
    assert all(t.state.is_finished() for t in study.get_trials())
    arm_trials = {x["trial"] for x in recs if x["op"] == "arm_start"}
    assert len(arm_trials) == len(starts)
    # the campaign still reached the right incumbent: prefetch off
    moves = [x for x in recs if x["op"] == "incumbent"]
    assert moves and "expert-prefetch" not in dict(moves[-1]["shape"]["args"])


def test_sigterm_ends_the_arm_removes_its_container_and_journals_it(tmp_path, sim_image, podman_host):
    slow_env = {**BASE_ENV, "SIMENGINE_TIME_SCALE": 1.0}         # a boot of minutes: SIGTERM lands mid-boot
    data = yaml.safe_load(open(campaign(tmp_path, sim_image, "term", levers=SMALL)))
    data["baseline"]["env"] = slow_env
    path = tmp_path / "term2.yaml"
    path.write_text(yaml.safe_dump(data))
    rc, _ = sigterm_once_booting(podman_host, "term", "run", str(path), "--quiet")
    assert rc != 0
    recs = records(tmp_path, "term")
    assert [x["verdict"] for x in recs if x["op"] == "arm_end"] == ["interrupted"]
    assert recs[-1]["op"] == "campaign_end" and "signal" in recs[-1]["reason"]
    assert podman_host.list_managed({LABEL_CAMPAIGN: "term"}) == []


def test_a_folder_of_a_different_campaign_file_is_refused(tmp_path, sim_image):
    path = campaign(tmp_path, sim_image, "same-name", levers=SMALL, budget={"max_arms": 1})
    assert tuner("run", path, "--quiet").returncode == 0
    data = yaml.safe_load(open(path))
    data["levers"]["max-num-seqs"] = [3, 4]
    open(path, "w").write(yaml.safe_dump(data))
    r = tuner("run", path, "--quiet")
    assert r.returncode == 2
    assert "written by a different campaign file" in r.stderr and "levers" in r.stderr
    assert tuner("run", path, "--quiet", "--force-resume").returncode == 0


def test_sd_notify_and_detach(tmp_path, sim_image):
    import socket
    import threading

    sock_path = str(tmp_path / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(sock_path)
    s.settimeout(60)
    path = campaign(tmp_path, sim_image, "notify", levers=SMALL, budget={"max_arms": 2})
    got, stop = [], threading.Event()

    def read():                                   # as systemd does: while the night runs
        s.settimeout(0.2)
        while not stop.is_set():
            try:
                got.append(s.recv(65536).decode())
            except socket.timeout:
                pass

    reader = threading.Thread(target=read)
    reader.start()
    try:
        r = tuner("run", path, "--quiet", env={"NOTIFY_SOCKET": sock_path})
    finally:
        time.sleep(0.5)
        stop.set()
        reader.join()
    assert r.returncode == 0, r.stderr[-2000:]
    assert got[0] == "READY=1" and any(m.startswith("STATUS=notify · arm 1 ") for m in got) and "WATCHDOG=1" in got
    # --detach returns at once; the daemon writes its pid and status reads the journal
    path2 = campaign(tmp_path, sim_image, "detached", levers=SMALL, budget={"max_arms": 3})
    r = tuner("run", path2, "--detach")
    assert r.returncode == 0 and "running in the background" in r.stdout
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        st = json.loads(tuner("status", path2, "--json").stdout or "{}") if (tmp_path / "journal" / "detached" / "journal.jsonl").exists() else {}
        if st.get("ended"):
            break
        time.sleep(1)
    assert st.get("arms") == 3 and st.get("ended", "").startswith("arm budget")
