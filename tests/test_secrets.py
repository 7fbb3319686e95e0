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


# -- the rule, by name and by value: a table both ways ------------------------------------------------
from arms.argv import redact_argv, redact_env  # noqa: E402
from arms.secrets import is_secret, looks_secret, seal_text  # noqa: E402

NAMES = [  # (name, sealed)
    ("HF_TOKEN", True), ("API_KEY", True), ("DB_PASS", True), ("HF_AUTH", True), ("DB_PASSWORD", True),
    ("MYSQL_PWD", True), ("PGPASSWORD", True), ("NGROK_AUTHTOKEN", True), ("AWS_SECRET_ACCESS_KEY", True),
    ("GOOGLE_APPLICATION_CREDENTIALS", True), ("SESSION_COOKIE", True), ("SESSION", True), ("SESSION_ID", True),
    ("PRIVATE_KEY", True), ("SECRET_KEY_BASE", True), ("HTTP_AUTHORIZATION", True), ("REDIS_PASSPHRASE", True),
    ("--hf-token", True), ("--api-key", True), ("env.DB_PASS", True), ("hfToken", True), ("dbPass", True),
    # an operator's levers and the tuner's own names stay readable
    ("MAX_JOBS", False), ("VLLM_USE_V1", False), ("OMP_NUM_THREADS", False), ("CUDA_VISIBLE_DEVICES", False),
    ("PYTORCH_CUDA_ALLOC_CONF", False), ("VLLM_ATTENTION_BACKEND", False), ("VLLM_WORKER_MULTIPROC_METHOD", False),
    ("R4D_LRU_UVA_TOKENS", False), ("TOKENIZERS_PARALLELISM", False), ("--max-num-batched-tokens", False),
    ("num_speculative_tokens", False), ("--tokenizer", False), ("speculative-config", False),
    ("KEYBOARD_LAYOUT", False),              # a keyboard, not a key: KEY runs on into letters
    ("BYPASS_CACHE", False),                 # "bypass" is not "pass": whole word parts only
    ("SESSION_TIMEOUT_S", False),            # an attribute of a secret (its timeout), not the secret
    ("MAX_KEY_SIZE", False), ("R4D_AUTH_MODE", False), ("HF_TOKEN_PATH", False), ("DB_PASSWORD_FILE", False),
    ("KV_BYTES_PER_TOKEN", False),           # a unit: bytes per token
    ("--allow-credentials", False), ("USE_AUTH", False),   # switches about a secret: on / off
]


@pytest.mark.parametrize("name, sealed", NAMES, ids=[n for n, _ in NAMES])
def test_which_names_are_secret(name, sealed):
    assert is_secret(name) is sealed
    env = {name: "plain-value"}
    assert redact_env(env) == {name: REDACTED if sealed else "plain-value"}
    assert seal({"env": env})["env"][name] == (REDACTED if sealed else "plain-value")


VALUES = [  # (value, how seal writes it: REDACTED, the value itself, or a text with the secret hidden in place)
    ("hf_SECRETauth", REDACTED),                                  # a short token: the prefix and mixed case
    ("hf_abcdefghijklmnopqrstu", REDACTED), ("sk-proj-ABCDEFGHIJKLMNOP1234", REDACTED),
    ("sk-ant-api03-Xy7Qw2Er9Ty4Ui8Op", REDACTED), ("ghp_0123456789abcdefABCDEF", REDACTED),
    ("gho_16C7e42F292c6912E7710c838347Ae178B4a", REDACTED), ("github_pat_11ABCDEFG0abcdefghij_xyZ12", REDACTED),
    ("xoxb-123456789012-abcdefABCDEF", REDACTED), ("glpat-xxxxxxxxxxxxxxxxxxxx", REDACTED),
    ("AKIAIOSFODNN7EXAMPLE", REDACTED), ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N", REDACTED),
    ("xK9fLq2mZp7RtW3v", REDACTED),                               # 16 random characters, three classes
    ("3kT9pQ/xZ2vLm8Rw+Yb4Nc7Hd1Fg6Js0Ue5Ka2Wq", REDACTED),       # base64, 40 characters
    (LEVER_SECRETS[0], REDACTED),                                 # one unbroken 32+ run mixing all three classes
    ("Bearer abcDEF123456", "Bearer ***"), ("postgres://admin:hunter22@db:5432/app", "postgres://admin:***@db:5432/app"),
    # left alone: digests, paths, JSON, model names, numbers, allocator settings, plain words
    ("8", "8"), ("2048", "2048"), ("a" * 64, "a" * 64), ("sha256:" + "3f2a9c" * 10, "sha256:" + "3f2a9c" * 10),
    ("localhost/x@sha256:" + "ab" * 32, "localhost/x@sha256:" + "ab" * 32),
    ("/models/Qwen3-Coder-480B-A35B-Instruct-FP8", "/models/Qwen3-Coder-480B-A35B-Instruct-FP8"),
    ("Qwen3-Coder-480B-A35B-Instruct-FP8", "Qwen3-Coder-480B-A35B-Instruct-FP8"),
    ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B"), ("DeepSeekCoderV2LiteInstruct", "DeepSeekCoderV2LiteInstruct"),
    ('{"method":"mtp","num_speculative_tokens":2}', '{"method":"mtp","num_speculative_tokens":2}'),
    ("expandable_segments:True", "expandable_segments:True"),
    ("max_split_size_mb:512,expandable_segments:True", "max_split_size_mb:512,expandable_segments:True"),
    ("FLASHINFER", "FLASHINFER"), ("TORCH_SDPA", "TORCH_SDPA"), ("hf_transfer", "hf_transfer"),
    ("GPU-6c1f3e2a-4b5d-11ee-8c90-0242ac120002", "GPU-6c1f3e2a-4b5d-11ee-8c90-0242ac120002"),
    ("enp65s0f0np0", "enp65s0f0np0"), ("0,1,2,3", "0,1,2,3"), ("bfloat16", "bfloat16"),
    ("hunter2", "hunter2"),                                       # short and plain: a secret only by its name
    ("https://huggingface.co/Qwen/Qwen3-30B-A3B", "https://huggingface.co/Qwen/Qwen3-30B-A3B"),
    ("Basic configuration", "Basic configuration"),
]


@pytest.mark.parametrize("value, sealed", VALUES, ids=[v[:24] for v, _ in VALUES])
def test_which_values_are_secret(value, sealed):
    assert looks_secret(value) is (sealed != value)
    assert seal({"MODEL_TAG": value, "list": [value]}) == {"MODEL_TAG": sealed, "list": [sealed]}
    assert redact_env({"MODEL_TAG": value}) == {"MODEL_TAG": REDACTED if sealed != value else value}
    assert redact_argv(["/m", "--model-tag", value]) == ["/m", "--model-tag", REDACTED if sealed != value else value]
    secret = value if sealed == REDACTED else ("abcDEF123456" if "Bearer" in value else "hunter22")
    if sealed != value:                   # the real value is one the campaign's Sealer hides in free text
        echoed = Sealer.of({"env": {"MODEL_TAG": value}}).text(f"engine echoed {value} !")
        assert secret not in echoed and echoed.startswith("engine echoed ") and echoed.endswith("*** !")
        assert secret in Sealer.of({"MODEL_TAG": value}).values
    else:
        assert Sealer.of({"env": {"MODEL_TAG": value}}).values == []


def test_the_headline_pairs_and_free_text():
    env = {"MAX_JOBS": "8", "DB_PASS": "hunter2", "HF_AUTH": "hf_SECRETauth", "OMP_NUM_THREADS": "16",
           "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "SESSION_TIMEOUT_S": "30"}
    assert seal({"env": env})["env"] == {**env, "DB_PASS": REDACTED, "HF_AUTH": REDACTED}
    s = Sealer.of({"env": env})
    assert set(s.values) == {"hunter2", "hf_SECRETauth"}
    assert s.text("login hunter2 with hf_SECRETauth; MAX_JOBS=8") == "login *** with ***; MAX_JOBS=8"
    # free text without the campaign's literals: prefixed tokens, key ids, Bearer, a URL's password
    assert seal_text("Authorization: Bearer abcDEF123456 from https://bob:pw1234@h/ key AKIAIOSFODNN7EXAMPLE "
                     "hf_SECRETauth, not hf_hub_download") == \
        "Authorization: Bearer *** from https://bob:***@h/ key *** ***, not hf_hub_download"


def test_a_lever_of_sealed_values_is_still_tuned():
    from arms import values

    lever = "env.R4D_AUTH_MODE"                                   # readable by name, sealed by the look
    vals = ["xK9fLq2mZp7RtW3v", "alpha", "hf_SECRETauth"]
    ch = values.choices(lever, vals)
    assert ch == ['"*** #0"', '"alpha"', '"*** #2"']
    assert [values.from_choice(lever, vals, c) for c in ch] == vals
    spec = {"method": "mtp", "num_speculative_tokens": 2}        # a JSON lever value stays itself
    assert values.choices("speculative-config", [spec]) == [json.dumps(spec, sort_keys=True)]


# -- a whole night and its promotion: DB_PASS and HF_AUTH nowhere -------------------------------------
NIGHT_SECRETS = {"DB_PASS": "hunter2", "HF_AUTH": "hf_SECRETauth",     # sealed by name (HF_AUTH by look too)
                 "MODEL_TAG": "xK9fLq2mZp7RtW3v"}                     # a plain name: sealed by its look only


def test_a_night_and_its_promotion_never_write_db_pass_or_hf_auth(tmp_path):
    from tests.test_campaign_sim import LEVERS

    units = tmp_path / "units"
    path = tmp_path / "sealed.yaml"
    path.write_text(yaml.safe_dump({
        "name": "sealed", "engine": "simengine",
        "baseline": {"image": "localhost/offload-tuner-simengine:sim", "model": "/models/sim", "args": BASE,
                     "env": {"R4D_LRU_GATHER_CHUNKS": 8, "MAX_JOBS": 8, **NIGHT_SECRETS}, "port": 8000},
        "levers": LEVERS, "journal": "journal", "budget": {"max_arms": 8},
        "production": {"unit": "sealed.service", "promote_as": "unit", "unit_file": str(units / "sealed.service"),
                       "podman_version": "5.0"}}))
    folder = tmp_path / "journal" / "sealed"
    # a night journaled as simulated is promoted only when asked (where the CLI has that switch)
    sim = ["--allow-simulated"] if "--allow-simulated" in _tuner("promote", "--help").stdout else []
    outputs = []
    for cmd in (["-v", "run", path, "--simulated"], ["report", folder], ["status", folder, "--json"],
                ["export", folder, "--format", "jsonl"], ["promote", folder, "--dry-run", *sim],
                ["promote", folder, "--write-only", *sim]):
        r = _tuner(*cmd)
        assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-3000:])
        outputs.append((cmd[0] if cmd[0] != "-v" else "run", r.stdout + r.stderr))
    dry, written = outputs[4][1], outputs[5][1]
    assert "--- /dev/null" in dry and "Environment=DB_PASS=***" in dry and "Environment=HF_AUTH=***" in dry
    assert "--env MODEL_TAG=***" in dry                             # the diff shows the names...
    assert f"wrote {units / 'sealed.service'}" in written
    unit = (units / "sealed.service").read_text()
    assert all(v in unit for v in NIGHT_SECRETS.values()) and "***" not in unit     # ...the file needs the values
    assert (units / "sealed.service").stat().st_mode & 0o777 == 0o600
    assert "MAX_JOBS=8" in unit and "MAX_JOBS=8" in dry             # and a lever stays readable
    files = [p for p in folder.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"journal.jsonl", "boot.json", "boot.log", "REPORT.md"} <= names, names
    journal = (folder / "journal.jsonl").read_text()
    assert '"MAX_JOBS":"8"' in journal and '"DB_PASS":"***"' in journal and '"HF_AUTH":"***"' in journal
    assert '"op":"promotion"' in journal
    for p in files:
        data = p.read_bytes()
        for v in NIGHT_SECRETS.values():
            assert v.encode() not in data, f"{v} in {p.relative_to(folder)}"
    for what, out in outputs:
        for v in NIGHT_SECRETS.values():
            assert v not in out, f"{v} in the output of tuner {what}"
