"""`tuner promote` / `tuner rollback` end to end where systemd is not running (as in CI): through
the Host protocol's unit control — a fake that records the calls, and a real path whose unit()
starts the written production file's shape with podman and checks its health."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import yaml

from arms.errors import ConfigError, HostError
from arms.lifecycle import container_spec
from arms.shape import ABSENT, Shape
from host.fake import FakeHost
from tuner import cli
from tuner.night.journal import Journal
from tuner.production.context import parse_file
from tuner.production.promote import promote, rollback
from arms.values import encode as encode_value
from tuner.production.units import parse_env_file, parse_quadlet, parse_service

UNIT = "frank-primary.service"
DIGEST = "localhost/offload-tuner-simengine@sha256:" + "ab" * 32
ARGS = {"tensor-parallel-size": 2, "max-model-len": 32768, "max-num-seqs": 4, "enable-prefix-caching": True,
        "speculative-config": {"method": "mtp", "num_speculative_tokens": 4}, "expert-prefetch": 1}


def base_shape(image=DIGEST, port=7773, env=None) -> Shape:
    return Shape.from_mapping({"image": image, "model": "/models/sim", "args": ARGS, "port": port,
                               "env": env or {"R4D_LRU_GATHER_CHUNKS": "8", "HF_TOKEN": "hf_secret"}})


def arm(n, kind, shape, change, verdict, decode=40.0, mad=0.1, boot_s=4.0, depth=166):
    return {"n": n, "kind": kind, "shape": shape, "change": change, "verdict": verdict, "boot_s": boot_s,
            "depths": {depth: (decode, mad)} if decode else {}}


def night(base: Shape, winner_change=("expert-prefetch", ABSENT), decode=(26.8, 40.6), **kw) -> list[dict]:
    """Seed 002's night in six arms: baseline, a confirmed winner, a parity, an unconfirmed
    better, a boot failure."""
    win = base.with_change(*winner_change)
    return [arm(0, "baseline", base, None, "baseline", decode[0], **kw),
            arm(1, "probe", win, winner_change, "better", decode[1], **kw),
            arm(2, "confirm", win, winner_change, "better", decode[1], **kw),
            arm(3, "probe", win.with_change("max-num-seqs", 3), ("max-num-seqs", 3), "parity", decode[1], **kw),
            arm(4, "probe", win.with_change("env.R4D_LRU_GATHER_CHUNKS", 32), ("env.R4D_LRU_GATHER_CHUNKS", 32),
                "better", decode[1] * 1.1, **kw),
            arm(5, "probe", win.with_change("max-num-seqs", 2), ("max-num-seqs", 2), "boot-failed:constraint-violation",
                None)]


def write_campaign(tmp: Path, base: Shape, arms: list[dict], production: dict, *, measure=None,
                   min_effect=0.02, name="prod-night", file: str | None = None) -> Path:
    raw = {"name": name, "engine": "simengine",
           "baseline": {"image": base.image, "model": base.model, "env": dict(base.env)},
           "measure": measure or {"depths": [166], "runs": 2, "warm_tokens": 8, "max_tokens": 32, "quiet_wait_s": 0},
           "noise": {"min_effect": min_effect}, "production": production}
    camp = tmp / "campaign.yaml"
    tmp.mkdir(parents=True, exist_ok=True)
    camp.write_text(yaml.safe_dump(raw))
    folder = tmp / "journal" / name
    j = Journal(folder / "journal.jsonl")
    j.append("campaign_start", campaign_hash="test", campaign=raw, file=file or str(camp), baseline=base.to_dict())
    incumbent = base
    for a in arms:
        ch = [a["change"][0], encode_value(a["change"][1])] if a["change"] else None
        j.append("arm_start", arm=a["n"], kind=a["kind"], shape=a["shape"].to_dict(), change=ch,
                 incumbent=incumbent.key(), trial=a["n"], why="test")
        end = {"verdict": a["verdict"], "boot": {"outcome": "ready", "boot_s": a["boot_s"]}}
        if a["depths"]:
            end["measurement"] = {"outcome": "measured", "depths": {
                str(d): {"median_decode_tok_s": m, "mad_decode_tok_s": mad} for d, (m, mad) in a["depths"].items()}}
            end["score"] = {"feasible": True, "violation": 0, "objective": next(iter(a["depths"].values()))[0]}
        j.append("arm_end", arm=a["n"], kind=a["kind"], **end)
        if a["kind"] == "confirm" and a["verdict"] == "better":
            j.append("incumbent", arm=a["n"], shape=a["shape"].to_dict(), score=end["score"], samples=[],
                     change=ch, previous=incumbent.key(), confirmed_arms=[a["n"] - 1, a["n"]])
            incumbent = a["shape"]
    j.append("campaign_end", reason="test", arms=len(arms))
    return folder


def promotions(folder: Path) -> list[tuple[int, str]]:
    return [(r["id"], r["action"]) for r in Journal(folder / "journal.jsonl").records if r["op"] == "promotion"]


# -- the fake host: systemd recorded, the service simulated from the file it would run -----------------
class ProdFake(FakeHost):
    """FakeHost with a virtual clock whose unit() runs the production file's shape: ``behave``
    maps the shape to (fails?, seconds to healthy)."""

    def __init__(self, target: Path, form: str, behave=lambda shape: (False, 2.0)):
        super().__init__()
        self.target, self.form, self.behave = target, form, behave
        self.t, self.loaded, self.ready_at, self.failed, self.running = 0.0, None, None, False, None
        self.units[UNIT] = "active"

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def unit(self, name, action):
        out = super().unit(name, action)
        if action == "daemon-reload":
            self.loaded = self.target.read_text() if self.target.exists() else None
        elif action in ("start", "restart"):
            if self.loaded is None:
                self.units[name] = "failed"
                raise HostError(f"`systemctl {action} {name}` failed (5): Unit {name} not found.")
            self.running = self.loaded
            shape = parse_file(self.form, self.loaded, "vllm").shape if self.form != "env-file" else None
            self.failed, delay = self.behave(shape if shape is not None else self.loaded)
            self.ready_at = self.t + delay
        elif action == "stop":
            self.running = None
        if action == "is-active" and self.running is not None and self.failed:
            return "failed"
        return out

    def http_client(self, cid, timeout=30.0):
        def answer(request: httpx.Request) -> httpx.Response:
            up = self.running is not None and not self.failed and self.t >= self.ready_at
            if not up:
                raise httpx.ConnectError("connection refused", request=request)
            if request.url.path == "/health":
                return httpx.Response(200)
            return httpx.Response(200, json={"choices": [{"text": "hi"}]})
        return httpx.Client(transport=httpx.MockTransport(answer))


def production(tmp: Path, form: str, **extra) -> dict:
    d = {"unit": UNIT, "promote_as": form, "podman_version": "5.0", "restore_timeout_s": 60}
    d.update({"quadlet": {"quadlet_dir": str(tmp / "quadlet")}, "unit": {"unit_file": str(tmp / "units" / UNIT)},
              "env-file": {"env_file": str(tmp / "frank-primary.env")}}[form])
    return {**d, **extra}


def smoke_at(value):
    calls = []

    def smoke(url, depth):
        calls.append((url, depth))
        return value, {"outcome": "measured", "reason": None}
    smoke.calls = calls
    return smoke


@pytest.fixture
def quadlet_night(tmp_path):
    base = base_shape()
    folder = write_campaign(tmp_path, base, night(base), production(tmp_path, "quadlet"))
    target = tmp_path / "quadlet" / "frank-primary.container"
    from tuner.production.units import render_quadlet

    target.parent.mkdir()
    target.write_text(render_quadlet(base, style="vllm", container_name="frank-primary", podman_version="5.0",
                                     timeout_s=900, label="hand-written"))
    return folder, target, base


def test_dry_run_shows_the_redacted_diff_and_touches_nothing(quadlet_night, capsys):
    folder, target, _ = quadlet_night
    before = target.read_text()
    host = ProdFake(target, "quadlet")
    res = promote(folder, dry_run=True, host=host, smoke=smoke_at(40.0))
    out = capsys.readouterr().out
    assert res.outcome == "dry-run" and res.arm == 2
    assert "-    --expert-prefetch 1 \\" in out and "arm 2 (expert-prefetch → absent): better, confirmed" in out
    assert "hf_secret" not in out and "HF_TOKEN=***" in out
    assert target.read_text() == before and host.unit_calls == [] and promotions(folder) == []


def test_promotes_the_final_incumbent(quadlet_night):
    folder, target, base = quadlet_night
    old = target.read_text()
    host = ProdFake(target, "quadlet")
    smoke = smoke_at(40.5)
    res = promote(folder, host=host, smoke=smoke, poll_s=0.5)
    assert res.outcome == "promoted" and res.arm == 2
    assert parse_quadlet(target.read_text()).shape == base.with_change("expert-prefetch", ABSENT)
    assert "hf_secret" in target.read_text()                  # the production file keeps its secrets
    backups = list(target.parent.glob("frank-primary.container.tuner-backup-001-*"))
    assert len(backups) == 1 and backups[0].read_text() == old
    assert host.unit_calls == [(UNIT, "is-active"), (UNIT, "daemon-reload"), (UNIT, "restart")] + \
        [(UNIT, "is-active")] * (len(host.unit_calls) - 3)
    assert smoke.calls == [("http://127.0.0.1:7773", 166)]
    assert promotions(folder) == [(1, "started"), (1, "promoted")]
    rec = [r for r in Journal(folder / "journal.jsonl").records if r["op"] == "promotion"]
    assert rec[0]["shape"]["env"]["HF_TOKEN"] == "***" and rec[1]["smoke"]["decode_tok_s"] == 40.5
    assert "hf_secret" not in (folder / "journal.jsonl").read_text()
    # promoting it again changes nothing and restarts nothing: every restart is an outage
    calls = len(host.unit_calls)
    assert promote(folder, host=host, smoke=smoke).outcome == "unchanged" and len(host.unit_calls) == calls


FAILURES = [
    ("unit fails", lambda shape: (True, 0.0), None, "unit frank-primary.service is failed"),
    ("health timeout", lambda shape: (False, 30.0), None, "health timeout"),
    ("slow smoke", lambda shape: (False, 1.0), 20.0, "slow smoke: 20.00 tok/s at depth 166"),
    ("smoke fails", lambda shape: (False, 1.0), None, "smoke measurement at depth 166 failed"),
]


@pytest.mark.parametrize("name,behave,smoke_value,reason", FAILURES, ids=[f[0] for f in FAILURES])
def test_each_failure_rolls_back_and_is_journaled(quadlet_night, name, behave, smoke_value, reason):
    folder, target, base = quadlet_night
    old = target.read_text()
    winner = base.with_change("expert-prefetch", ABSENT)
    host = ProdFake(target, "quadlet", behave=lambda shape: behave(shape) if shape == winner else (False, 2.0))
    res = promote(folder, host=host, smoke=smoke_at(smoke_value), margin_s=5.0, poll_s=0.5)
    assert res.outcome == "rolled-back" and reason in res.reason and res.healthy is True
    assert target.read_text() == old                         # the backup is back in place
    assert [a for _, a in host.unit_calls if a in ("daemon-reload", "restart")] == ["daemon-reload", "restart"] * 2
    assert host.units[UNIT] == "active" and not host.failed
    assert promotions(folder) == [(1, "started"), (1, "rolled-back")]
    rb = [r for r in Journal(folder / "journal.jsonl").records if r["op"] == "promotion"][-1]
    assert reason in rb["reason"] and rb["healthy"] is True
    if name == "health timeout":
        assert 9.0 <= host.t <= 12.0     # gave up at the arm's 4 s boot + the 5 s margin, then the old one came up


@pytest.mark.parametrize("arm_n,needle", [
    (3, "arm 3 (max-num-seqs → 3) was parity, not better"),
    (4, "arm 4 (env.R4D_LRU_GATHER_CHUNKS → 32) was better but never confirmed by a second boot"),
    (0, "arm 0 was baseline, not better"),
    (9, "arm 9 does not exist"),
])
def test_an_arm_that_was_not_better_and_confirmed_is_refused_unless_forced(quadlet_night, arm_n, needle):
    folder, target, _ = quadlet_night
    host = ProdFake(target, "quadlet")
    with pytest.raises(ConfigError, match="--force|exist") as e:
        promote(folder, arm_n, host=host, smoke=smoke_at(40.0))
    assert needle in str(e.value)
    assert host.unit_calls == [] and promotions(folder) == []
    if arm_n == 3:
        assert promote(folder, 3, force=True, host=host, smoke=smoke_at(40.6), poll_s=0.5).outcome == "promoted"
        assert parse_quadlet(target.read_text()).shape.value_of("max-num-seqs") == 3


def test_a_boot_failed_arm_is_refused_even_with_force(quadlet_night):
    folder, target, _ = quadlet_night
    with pytest.raises(ConfigError, match="arm 5 came to boot-failed:constraint-violation.*not even with --force"):
        promote(folder, 5, force=True, host=ProdFake(target, "quadlet"))


def test_a_confirmed_arm_named_by_its_probe_is_accepted(quadlet_night):
    folder, target, _ = quadlet_night
    res = promote(folder, 1, host=ProdFake(target, "quadlet"), smoke=smoke_at(40.6), poll_s=0.5)
    assert res.outcome == "promoted" and res.arm == 1


def test_no_finished_arms_and_no_winner_are_clear(tmp_path):
    base = base_shape()
    empty = write_campaign(tmp_path / "a", base, [], production(tmp_path, "quadlet"))
    with pytest.raises(ConfigError, match="no finished arms yet"):
        promote(empty, host=ProdFake(tmp_path / "x", "quadlet"))
    flat = write_campaign(tmp_path / "b", base, night(base)[:1], production(tmp_path, "quadlet"))
    with pytest.raises(ConfigError, match="confirmed no winner: the final incumbent is still the baseline"):
        promote(flat, host=ProdFake(tmp_path / "x", "quadlet"))
    with pytest.raises(ConfigError, match="holds no journal"):
        promote(tmp_path, host=ProdFake(tmp_path / "x", "quadlet"))


def test_plain_unit_form_promotes_and_rolls_back_on_demand(tmp_path):
    base = base_shape()
    folder = write_campaign(tmp_path, base, night(base), production(tmp_path, "unit"))
    target = tmp_path / "units" / UNIT
    host = ProdFake(target, "unit")
    res = promote(folder, host=host, smoke=smoke_at(40.6), poll_s=0.5)     # no file before: a new unit
    assert res.outcome == "promoted"
    assert parse_service(target.read_text()).shape == base.with_change("expert-prefetch", ABSENT)
    assert target.stat().st_mode & 0o777 == 0o600                          # it holds HF_TOKEN
    res = rollback(folder, host=host, poll_s=0.5)
    assert res.outcome == "restored" and not target.exists()               # there was no file before it
    assert host.unit_calls[-2:] == [(UNIT, "daemon-reload"), (UNIT, "stop")]   # nothing to restart
    assert promotions(folder) == [(1, "started"), (1, "promoted"), (1, "rolled-back")]
    with pytest.raises(ConfigError, match="nothing to roll back"):
        rollback(folder, host=host)


def test_rollback_walks_back_one_promotion_at_a_time_and_respects_edits(quadlet_night):
    folder, target, _ = quadlet_night
    original = target.read_text()
    host = ProdFake(target, "quadlet")
    promote(folder, 2, host=host, smoke=smoke_at(40.6), poll_s=0.5)
    second = target.read_text()
    promote(folder, 3, force=True, host=host, smoke=smoke_at(40.6), poll_s=0.5)
    target.write_text(target.read_text() + "# an operator's edit\n")
    with pytest.raises(ConfigError, match="changed since promotion #2"):
        rollback(folder, host=host)
    assert rollback(folder, force=True, host=host, poll_s=0.5).healthy
    assert target.read_text() == second
    assert rollback(folder, host=host, poll_s=0.5).healthy
    assert target.read_text() == original
    assert promotions(folder)[-2:] == [(2, "rolled-back"), (1, "rolled-back")]


def test_an_interrupted_promotion_blocks_the_next_until_rolled_back(quadlet_night):
    folder, target, _ = quadlet_night
    original = target.read_text()
    host = ProdFake(target, "quadlet")
    boom = ProdFake(target, "quadlet")

    def crash(name, action):                   # the tuner dies right after writing the file
        if action == "daemon-reload":
            raise KeyboardInterrupt
        return ProdFake.unit(boom, name, action)
    boom.unit = crash
    with pytest.raises(KeyboardInterrupt):
        promote(folder, host=boom, smoke=smoke_at(40.6))
    assert promotions(folder) == [(1, "started")] and target.read_text() != original
    with pytest.raises(ConfigError, match="promotion #1 .* was interrupted"):
        promote(folder, host=host, smoke=smoke_at(40.6))
    assert rollback(folder, host=host, poll_s=0.5).healthy and target.read_text() == original


def test_refuses_while_the_campaign_runs_or_its_guard_holds_the_unit(quadlet_night):
    import os

    folder, target, _ = quadlet_night
    (folder / "daemon.pid").write_text(str(os.getpid()))
    with pytest.raises(ConfigError, match="still running"):
        promote(folder, host=ProdFake(target, "quadlet"), smoke=smoke_at(40.6))
    (folder / "daemon.pid").unlink()
    Journal(folder / "journal.jsonl").append("guard", unit=UNIT, action="stopped", state_before="active")
    with pytest.raises(ConfigError, match="guard still holds"):
        promote(folder, host=ProdFake(target, "quadlet"), smoke=smoke_at(40.6))


# -- env-file form -----------------------------------------------------------------------------------
def test_env_file_promotion_refuses_an_unmapped_lever_then_writes_the_mapped_vars(tmp_path):
    base = base_shape()
    env_file = tmp_path / "frank-primary.env"
    env_file.write_text("FRANK_PRIMARY_SEQS=4\nFRANK_PRIMARY_CACHE_DIR=/home/dank/.cache/frank-primary\n")
    prod = production(tmp_path, "env-file", mapping={"max-num-seqs": "FRANK_PRIMARY_SEQS"})
    folder = write_campaign(tmp_path, base, night(base), prod)
    host = ProdFake(env_file, "env-file")
    with pytest.raises(ConfigError, match="no variable for the changed lever expert-prefetch 1 → absent"):
        promote(folder, host=host, smoke=smoke_at(40.6))
    assert host.unit_calls == []
    prod["mapping"]["expert-prefetch"] = "FRANK_PRIMARY_PREFETCH"
    (tmp_path / "campaign.yaml").write_text(yaml.safe_dump({**yaml.safe_load((tmp_path / "campaign.yaml").read_text()),
                                                            "production": prod}))
    assert promote(folder, host=host, smoke=smoke_at(40.6), poll_s=0.5).outcome == "promoted"
    assert parse_env_file(env_file.read_text()) == {"FRANK_PRIMARY_SEQS": "4", "FRANK_PRIMARY_PREFETCH": "",
                                                    "FRANK_PRIMARY_CACHE_DIR": "/home/dank/.cache/frank-primary"}
    assert (UNIT, "restart") in host.unit_calls


def test_cli_exit_codes(quadlet_night, capsys):
    folder, _, _ = quadlet_night
    assert cli.main(["promote", str(folder), "--dry-run"]) == 0
    assert "--expert-prefetch 1" in capsys.readouterr().out
    assert cli.main(["promote", str(folder), "--arm", "3"]) == 2
    assert "was parity, not better" in capsys.readouterr().err
    assert cli.main(["rollback", str(folder)]) == 2


# -- the real path: systemd played by podman ----------------------------------------------------------
class PodmanUnits:
    """A PodmanHost whose unit() does what systemd would with the written file: daemon-reload
    reads it back into a Shape; start/restart (re)creates that container with podman; stop
    removes it; is-active is the container's state."""

    def __init__(self, podman_host, target: Path, form: str, extra_env: dict | None = None):
        self.__dict__["_h"] = podman_host
        self.target, self.form, self.extra_env = target, form, extra_env or {}
        self.loaded, self.cid, self.unit_calls, self.started = None, None, [], []

    def __getattr__(self, name):
        return getattr(self._h, name)

    def unit(self, name, action):
        self.unit_calls.append((name, action))
        if action == "daemon-reload":
            self.loaded = parse_file(self.form, self.target.read_text(), "vllm") if self.target.exists() else None
        elif action == "is-active":
            if self.cid is None:
                return "inactive"
            return "active" if self._h.state(self.cid).running else "failed"
        elif action in ("start", "restart", "stop"):
            if self.cid is not None:
                self._h.kill(self.cid)          # `podman stop`, without its 10 s SIGTERM grace
                self._h.remove(self.cid)
                self.cid = None
            if action != "stop":
                if self.loaded is None:
                    raise HostError(f"Unit {name} not found.")
                spec = container_spec(self.loaded.shape, campaign="promote-real", arm=len(self.started),
                                      extra_env=self.extra_env)
                spec = replace(spec, name=self.loaded.container_name)
                self.cid = self._h.start(spec)
                self.started.append(self.loaded.shape)
        return "ok"

    def close(self):
        if self.cid is not None:
            self._h.kill(self.cid)
            self._h.remove(self.cid)


def real_night(tmp_path, base, form, winner_change, decode, boot_s):
    arms = night(base, winner_change, decode=(decode / 2, decode), boot_s=boot_s)
    folder = write_campaign(tmp_path, base, arms, production(tmp_path, form), min_effect=0.15)
    target = {"quadlet": tmp_path / "quadlet" / "frank-primary.container", "unit": tmp_path / "units" / UNIT}[form]
    from tuner.production.units import render_quadlet, render_service

    render = render_quadlet if form == "quadlet" else render_service
    kw = {"podman_version": "5.0"} if form == "quadlet" else {}
    target.parent.mkdir(parents=True)
    target.write_text(render(base, style="vllm", container_name=f"promote-real-{base.port}", timeout_s=120,
                             label="before", **kw))
    return folder, target


def measured_decode(podman_host, shape, tmp_path) -> float:
    from arms.boot import BootLimits, boot_arm
    from arms.measure import MeasurePlan, measure_engine
    from arms.profiles import load_profile
    from arms.prompts import api_from_profile

    prof = load_profile("simengine")
    with boot_arm(podman_host, shape, prof, campaign="promote-real", arm="ref", folder=tmp_path / "ref",
                  limits=BootLimits(60, 30, 0.2)) as (r, b):
        assert r.outcome == "ready", r.report.evidence
        m = measure_engine(b.base_url, MeasurePlan(depths=(166,), runs=2, warm_tokens=8, max_tokens=32),
                           api_from_profile(prof))
    return m.depths[166].median_decode_tok_s


REAL = [  # form, winner change, journaled decode (x the real one), boot_s, margin, outcome, reason
    ("quadlet", ("expert-prefetch", ABSENT), 1.0, 5.0, 20.0, "promoted", None),
    ("unit", ("max-num-seqs", 2), 1.0, 5.0, 20.0, "rolled-back", "is failed"),
    ("quadlet", ("env.SIMENGINE_TIME_SCALE", "0.05"), 1.0, 0.5, 1.0, "rolled-back", "health timeout"),
    ("unit", ("expert-prefetch", ABSENT), 2.0, 5.0, 20.0, "rolled-back", "slow smoke"),
]


@pytest.mark.podman
@pytest.mark.parametrize("form,change,factor,boot_s,margin,outcome,reason", REAL,
                         ids=["promoted", "unit-fails", "health-timeout", "slow-smoke"])
def test_real_promotion_and_rollback_with_podman(tmp_path, sim_image, podman_host, form, change, factor, boot_s,
                                                 margin, outcome, reason):
    from tests.conftest import free_port

    base = base_shape(sim_image.ref, free_port(), env={"SIMENGINE_TIME_SCALE": "0.002", "SIMENGINE_NOISE": "0",
                                                       "SIMENGINE_DECODE_SCALE": "4"})
    winner = base.with_change(*change)
    real = measured_decode(podman_host, winner, tmp_path) if outcome == "promoted" or reason == "slow smoke" else 40.0
    folder, target = real_night(tmp_path, base, form, change, real * factor, boot_s)
    host = PodmanUnits(podman_host, target, form)
    try:
        host.unit(UNIT, "daemon-reload")
        host.unit(UNIT, "start")                               # production runs the baseline
        res = promote(folder, host=host, margin_s=margin, poll_s=0.2)
        assert res.outcome == outcome, res.reason
        assert host.started[1] == winner                        # the written file's shape was what ran
        recs = [r for r in Journal(folder / "journal.jsonl").records if r["op"] == "promotion"]
        if outcome == "promoted":
            assert [r["action"] for r in recs] == ["started", "promoted"]
            assert abs(recs[-1]["smoke"]["decode_tok_s"] / real - 1) < 0.15
            cmd = podman_host.client.containers.get(host.cid).attrs["Config"]["Cmd"]
            assert "--expert-prefetch" not in cmd and parse_file(form, target.read_text(), "vllm").shape == winner
            res = rollback(folder, host=host, poll_s=0.2)      # and back out on demand
        else:
            assert reason in res.reason and [r["action"] for r in recs] == ["started", "rolled-back"]
        assert res.healthy is True
        assert host.started[-1] == base and host.unit(UNIT, "is-active") == "active"
        assert parse_file(form, target.read_text(), "vllm").shape == base
        with httpx.Client() as c:
            assert c.get(f"http://127.0.0.1:{base.port}/health").status_code == 200
    finally:
        host.close()
    assert json.loads((folder / "journal.jsonl").read_text().splitlines()[-1])["action"] == "rolled-back"


# -- a promotion a new user can try: systemd checked up front, --write-only, honest words -----------
def test_without_systemd_promote_refuses_before_writing_and_write_only_writes(tmp_path, monkeypatch, capsys):
    base = base_shape()
    folder = write_campaign(tmp_path, base, night(base), production(tmp_path, "unit"))
    target = tmp_path / "units" / UNIT
    empty = tmp_path / "no-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))                 # no systemctl here
    assert cli.main(["promote", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "cannot reach systemd to restart frank-primary.service: there is no systemctl" in err
    assert "--write-only" in err and not target.exists() and promotions(folder) == []
    assert cli.main(["promote", str(folder), "--write-only"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {target}" in out and "was not reloaded or restarted" in out
    assert parse_service(target.read_text()).shape == base.with_change("expert-prefetch", ABSENT)
    assert cli.main(["rollback", str(folder)]) == 0          # the promotion was write-only: so is its rollback
    out = capsys.readouterr().out
    assert f"removed the file it wrote (there was no {UNIT} before)" in out and "restored" not in out
    assert not target.exists()
    assert promotions(folder) == [(1, "started"), (1, "promoted"), (1, "rolled-back")]


def test_a_failed_promotion_of_a_new_unit_does_not_claim_a_rollback(tmp_path, caplog):
    base = base_shape()
    folder = write_campaign(tmp_path, base, night(base), production(tmp_path, "unit"))
    target = tmp_path / "units" / UNIT
    host = ProdFake(target, "unit", behave=lambda shape: (True, 2.0))     # the new unit fails
    caplog.set_level("INFO", logger="tuner.promote")
    lines = []
    res = promote(folder, host=host, smoke=smoke_at(40.6), poll_s=0.5, out=lines.append)
    assert res.outcome == "rolled-back" and not target.exists()
    assert "NOT healthy" not in caplog.text and "restored and healthy" not in caplog.text
    assert "there was no such file before the promotion, so nothing was restored" in caplog.text


def test_a_running_night_is_still_running_not_without_a_winner(tmp_path):
    import os

    base = base_shape()
    arms = night(base)[:1]                                   # only the baseline so far: no winner yet
    folder = write_campaign(tmp_path, base, arms, production(tmp_path, "unit"))
    (folder / "daemon.pid").write_text(str(os.getpid()))
    with pytest.raises(ConfigError, match="still running") as e:
        promote(folder, host=ProdFake(tmp_path / "units" / UNIT, "unit"))
    assert "no winner" not in str(e.value)


def test_the_demo_campaign_promotes_into_a_folder_it_owns():
    from tuner.night.campaign import load_campaign

    camp = load_campaign(Path(__file__).resolve().parent.parent / "examples" / "sim-campaign.yaml")
    prod = camp.production
    assert prod.promote_as == "unit" and prod.unit == "sim-demo.service"
    assert not Path(prod.unit_file).is_absolute() and "journal/" in prod.unit_file


# -- one writer: promote and rollback hold the campaign folder's lock ----------------------------------
def test_promote_refuses_while_a_run_holds_the_folder_and_holds_it_while_it_writes(quadlet_night, capsys):
    import subprocess
    import sys

    from tuner.night.lock import CampaignBusy, CampaignLock, holder, is_held

    folder, target, base = quadlet_night
    run = subprocess.Popen([sys.executable, "-c", "import sys, time; from tuner.night.lock import CampaignLock; "
                            "CampaignLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)",
                            str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert run.stdout.readline().strip() == "held"          # a `tuner run` of this campaign, mid-night
        journal, unit = (folder / "journal.jsonl").read_bytes(), target.read_text()
        for cmd in ("promote", "rollback"):
            assert cli.main([cmd, str(folder)]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and f"is being run by pid {run.pid} on host" in err[0], err
            assert f"`tuner {cmd}` waits for it to end" in err[0]
        with pytest.raises(CampaignBusy):
            promote(folder, host=ProdFake(target, "quadlet"), smoke=smoke_at(40.6))
        assert (folder / "journal.jsonl").read_bytes() == journal and target.read_text() == unit
        assert promote(folder, dry_run=True, host=ProdFake(target, "quadlet")).outcome == "dry-run"   # reads only
        assert (folder / "journal.jsonl").read_bytes() == journal
    finally:
        run.kill()
        run.wait()
    seen = []

    class Watching(ProdFake):
        def unit(self, name, action):        # mid-promotion: the folder is held, a run would refuse
            h = holder(folder)
            with pytest.raises(CampaignBusy, match=r"held by `tuner (promote|rollback)`, pid \d+ .*one `tuner run` per campaign"):
                CampaignLock(folder).acquire()
            seen.append((action, h["command"], is_held(folder)))
            return super().unit(name, action)

    assert promote(folder, host=Watching(target, "quadlet"), smoke=smoke_at(40.6), poll_s=0.5).outcome == "promoted"
    assert seen and all(c == "tuner promote" and held for _, c, held in seen)
    assert not is_held(folder) and holder(folder) is None     # released when it is done
    seen.clear()
    assert rollback(folder, host=Watching(target, "quadlet"), poll_s=0.5).healthy
    assert seen and all(c == "tuner rollback" for _, c, _ in seen) and not is_held(folder)


def test_promote_reads_the_campaign_file_beside_its_folder_not_in_the_cwd(tmp_path, monkeypatch):
    """A journal naming its campaign file relatively (as given to `tuner run`): promote finds the
    file from the campaign folder, not from wherever it is run, where another file may sit."""
    base = base_shape()
    site = tmp_path / "site"
    folder = write_campaign(site, base, night(base), production(site, "unit"), file="campaign.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    decoy = yaml.safe_load((site / "campaign.yaml").read_text())
    decoy["production"] = production(elsewhere, "unit")
    (elsewhere / "campaign.yaml").write_text(yaml.safe_dump(decoy))
    monkeypatch.chdir(elsewhere)
    target = site / "units" / UNIT
    res = promote(folder, host=ProdFake(target, "unit"), smoke=smoke_at(40.6), poll_s=0.5)
    assert res.outcome == "promoted" and res.target == str(target) and target.exists()
    assert not (elsewhere / "units").exists()
    # and a night run from a relative path journals the file absolutely
    from tests.test_campaign_sim import campaign

    monkeypatch.chdir(tmp_path)
    path = campaign(tmp_path, "relative", budget={"max_arms": 1})
    assert cli.main(["run", path.name, "--simulated", "--quiet"]) == 0
    start = Journal(tmp_path / "journal" / "relative" / "journal.jsonl").records[0]
    assert start["file"] == str(path.resolve())
