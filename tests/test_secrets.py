"""Secrets sealed at one gate: one rule, identity from the real shape, the sealed copy on disk."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from arms.secrets import REDACTED, Sealer, looks_like_token, seal, secret_values
from tests.conftest import REPO
from tests.test_campaign_sim import BASE

ENV_SECRET = "hf_EnvBaselineSecret0123456789abc"
FLAG_SECRET = "plainFlagPassw0rd"                       # short and not token-looking: secret by its flag's name
LEVER_SECRETS = ["Zq8LeverValueNumberOne0123456789abcdXY", "Zq8LeverValueNumberTwo0123456789abcdXY"]
SECRETS = [ENV_SECRET, FLAG_SECRET, *LEVER_SECRETS]


@pytest.mark.parametrize("value, token", [
    ("hf_abcdefghijklmnopqrstu", True), ("sk-proj-ABCDEFGHIJKLMNOP1234", True),
    ("ghp_0123456789abcdefABCDEF", True), (LEVER_SECRETS[0], True),
    ("a" * 64, False),                                            # a hex digest
    ("localhost/x@sha256:" + "a" * 64, False), ("/models/Qwen3-Coder-480B-A35B-Instruct-FP8", False),
    ("R4D_LRU_UVA_TOKENS", False), ("2048", False), (2048, False),
])
def test_what_looks_like_a_token(value, token):
    assert looks_like_token(value) is token


def test_one_rule_for_env_flags_argv_changes_and_text():
    rec = {"shape": {"env": {"HF_TOKEN": "abc123", "R4D_LRU_UVA_TOKENS": "2048"},
                     "args": [["api-key", "k1"], ["max-num-batched-tokens", 1024], ["model-tag", "hf_abcdefghijklmnopqrstu"]]},
           "change": ["env.DB_PASSWORD", "pw1234x"], "argv": ["serve", "--hf-token", "t0pSecret", "--port", "8000"],
           "evidence": "engine said: using token hf_abcdefghijklmnopqrstu for download"}
    got = seal(rec)
    assert got["shape"]["env"] == {"HF_TOKEN": REDACTED, "R4D_LRU_UVA_TOKENS": "2048"}
    assert got["shape"]["args"] == [["api-key", REDACTED], ["max-num-batched-tokens", 1024], ["model-tag", REDACTED]]
    assert got["change"] == ["env.DB_PASSWORD", REDACTED]
    assert got["argv"] == ["serve", "--hf-token", REDACTED, "--port", "8000"]
    assert "hf_abc" not in got["evidence"]
    s = Sealer(secret_values(rec))
    assert s.text("echo: abc123 and t0pSecret and pw1234x") == "echo: *** and *** and ***"


def _campaign(tmp_path, name, secrets: bool):
    env = {"R4D_LRU_GATHER_CHUNKS": 8, "R4D_LRU_GATHER_LANES": 16}
    args = dict(BASE)
    levers = {"expert-prefetch": ["absent", 1, 2], "env.R4D_LRU_GATHER_CHUNKS": [8, 32],
              "env.R4D_AUTH_MODE": LEVER_SECRETS if secrets else ["alpha", "beta"]}
    if secrets:
        env["HF_TOKEN"] = ENV_SECRET
        args["hf-token"] = FLAG_SECRET
    else:
        args["hf-token"] = "none"
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump({
        "name": name, "engine": "simengine",
        "baseline": {"image": "localhost/offload-tuner-simengine:sim", "model": "/models/sim", "args": args,
                     "env": env, "port": 8000},
        "levers": levers, "journal": "journal", "budget": {"max_arms": 14}}))
    return p


def _tuner(*args):
    return subprocess.run([sys.executable, "-m", "tuner.cli", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def _moves(folder):
    recs = [json.loads(x) for x in (folder / "journal.jsonl").read_text().splitlines()]
    kinds = [(r["kind"], (r.get("change") or [None])[0]) for r in recs if r["op"] == "arm_start"]
    verdicts = [r.get("verdict") for r in recs if r["op"] == "arm_end"]
    moves = [(r["arm"], (r.get("change") or [None])[0]) for r in recs if r["op"] == "incumbent"]
    return kinds, verdicts, moves


def test_a_campaign_with_secrets_decides_as_one_without_and_leaks_them_nowhere(tmp_path):
    runs = {}
    for secrets in (False, True):
        # one campaign name in two places: the simulated engine's noise follows the container's
        # name, so the two nights see the same noise and only the secrets differ
        where = tmp_path / ("sealed" if secrets else "plain")
        where.mkdir()
        path = _campaign(where, "night", secrets)
        r = _tuner("-v", "run", path, "--simulated")
        assert r.returncode == 0, r.stderr[-3000:]
        folder = where / "journal" / "night"
        assert _tuner("report", folder).returncode == 0
        for fmt in ("csv", "jsonl"):
            assert _tuner("export", folder, "--format", fmt).returncode == 0
        status = _tuner("status", folder, "--json")
        assert status.returncode == 0
        runs[secrets] = (folder, r.stdout + r.stderr + status.stdout + status.stderr)
    plain, sealed = _moves(runs[False][0]), _moves(runs[True][0])
    assert sealed == plain
    assert sealed[1][0] == "baseline" and sealed[2], sealed          # the baseline's score was set, the night moved
    assert ("probe", "env.R4D_AUTH_MODE") in sealed[0]
    folder, logs = runs[True]
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert any(p.name == "boot.json" for p in files) and any(p.name == "REPORT.md" for p in files)
    assert any(p.name == "arms.csv" for p in files) and (folder / "optuna.journal").exists()
    for p in files:
        data = p.read_bytes()
        for s in SECRETS:
            assert s.encode() not in data, f"{s} leaked into {p.relative_to(folder)}"
    for s in SECRETS:
        assert s not in logs


def test_a_json_file_stays_json_and_numbers_are_never_hit(tmp_path):
    s = Sealer.of({"env": {"MAX_KEY_SIZE": "4096", "HF_TOKEN": "s3cr3t-value"}})
    assert s.values == ["s3cr3t-value"]                      # a number is never a literal to hide
    p = tmp_path / "measure.json"
    p.write_text(json.dumps({"kv_pool_tokens": 40960, "echo": "token s3cr3t-value", "args": [["api-key", "x"]]}))
    assert s.file(p)
    got = json.loads(p.read_text())
    assert got == {"kv_pool_tokens": 40960, "echo": "token ***", "args": [["api-key", "***"]]}


def test_boot_logs_are_sealed_as_they_are_written(tmp_path, monkeypatch):
    """The engine echoes its argv (the simulated vLLM's non-default args, hf_token included):
    the boot log on disk never holds the secret, even with the after-arm pass switched off."""
    from arms.profiles import load_profile
    from tests.test_campaign_sim import night

    monkeypatch.setattr(Sealer, "file", lambda self, path: False)       # only the writer's own sealing left
    _, recs, _ = night(_campaign(tmp_path, "echo", True), max_arms=3)
    logs = sorted((tmp_path / "journal" / "echo" / "arms").glob("*/boot.log"))
    assert logs and all(p.stat().st_size for p in logs)
    for p in logs:
        text = p.read_text()
        assert "'hf_token': '***'" in text, text[:2000]        # the echo is there, sealed
        for s in SECRETS:
            assert s not in text, f"{s} in {p}"
    assert load_profile("simengine")


def test_the_joint_study_holds_sealed_choices_and_rebuilds_from_the_journal(tmp_path):
    """Joint mode: Optuna's params are the levers' sealed choices ("*** #i" for a secret value),
    the arm journal keeps them, and a deleted study is rebuilt with the same params."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from tests.test_campaign_sim import night

    path = _campaign(tmp_path, "jointly", True)
    raw = yaml.safe_load(path.read_text())
    raw["search"] = "joint"
    path.write_text(yaml.safe_dump(raw))
    _, recs, _ = night(path, max_arms=6)
    folder = tmp_path / "journal" / "jointly"
    joint = [r for r in recs if r["op"] == "arm_start" and r["kind"] == "joint"]
    assert joint and all(r["params"]["env.R4D_AUTH_MODE"] in ('"*** #0"', '"*** #1"') for r in joint)
    for p in folder.rglob("*"):
        if p.is_file():
            for s in SECRETS:
                assert s.encode() not in p.read_bytes(), f"{s} leaked into {p.relative_to(folder)}"

    def params():
        study = optuna.load_study(study_name="jointly", storage=JournalStorage(JournalFileBackend(
            str(folder / "optuna.journal"))))
        return [(t.number, t.params, t.state) for t in study.get_trials()]

    before = params()
    assert [p for _, p, _ in before if "lever" not in p] == [r["params"] for r in joint]
    (folder / "optuna.journal").unlink()
    night(path, max_arms=6)                                  # resume: the budget is spent, the study rebuilt
    assert params() == before
