"""The campaign schema: every malformed file is refused with exit 2, one `FILE:LINE: KEY: message`
line per error, all errors of a file at once, no traceback, and nothing contacted (CONTAINER_HOST
points at a socket that does not exist; a podman message would mean validation came too late).

Each case is a campaign text; every line that holds an error ends in `#!`, and the errors must
name exactly those lines."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tuner import cli

HEAD = """\
name: schema-test
engine: vllm-expert-offload
baseline:
  image: localhost/offload-tuner-simengine:latest
  model: /models/sim
  env: {R4D_LRU_GATHER_CHUNKS: 8}
"""

CASES = [
    ("confirm-string", "noise: {confirm: 'false'}  #!\n", ["noise.confirm: should be a valid boolean, got 'false'"]),
    ("max-arms-float", "budget:\n  max_arms: 2.7  #!\n", ["budget.max_arms: should be a valid integer, got 2.7"]),
    ("hours-bool", "budget:\n  hours: true  #!\n", ["budget.hours: should be a valid number, got True"]),
    ("boot-negative", "boot:\n  timeout_s: -5  #!\n", ["boot.timeout_s: should be greater than 0"]),
    ("max-tokens-bool", "measure:\n  max_tokens: true  #!\n", ["measure.max_tokens: should be a valid integer"]),
    ("min-effect-negative", "noise:\n  min_effect: -1  #!\n", ["noise.min_effect: should be greater than or equal to 0"]),
    ("recheck-zero", "noise:\n  recheck_every: 0  #!\n", ["noise.recheck_every: should be greater than or equal to 1"]),
    ("prune-below-5", "noise:\n  prune_below: 5  #!\n", ["noise.prune_below: should be less than 1"]),
    ("runs-word", "measure:\n  runs: three  #!\n", ["measure.runs: should be a valid integer, got 'three'"]),
    ("journal-proc", "journal: /proc/nope  #!\n", ["journal: '/proc/nope': /proc cannot hold files"]),
    ("until-unquoted", "budget:\n  until: 7:30  #!\n", ['budget.until: ', 'quote it: until: "07:30"']),
    ("until-bad-time", "budget:\n  until: '25:00'  #!\n", ["budget.until: '25:00' is not a time of day"]),
    ("until-and-hours", "budget:\n  until: '07:00'\n  hours: 3  #!\n", ["budget.hours: give until or hours, not both"]),
    ("timezone-unknown", "budget:\n  until: '07:00'\n  timezone: Mars/Olympus  #!\n",
     ["budget.timezone: 'Mars/Olympus' is not an IANA time zone"]),
    ("unknown-top-key", "levres: {}  #!\n", ["levres: unknown key; did you mean 'levers'?"]),
    ("unknown-noise-key", "noise:\n  min_efect: 0.1  #!\n", ["noise.min_efect: unknown key; did you mean 'min_effect'?"]),
    ("lever-typo", "levers:\n  expert-prefech: [1, 2]  #!\n", ["levers.expert-prefech: 'expert-prefech' is not a flag",
                                                              "did you mean 'expert-prefetch'?"]),
    ("lever-empty", "levers:\n  max-num-seqs: []  #!\n", ["levers.max-num-seqs: lever 'max-num-seqs' has no values"]),
    ("lever-scalar", "levers:\n  max-num-seqs: 4  #!\n", ["levers.max-num-seqs: lever 'max-num-seqs': values must be a list"]),
    ("lever-bad-numerics", "levers:\n  kv-cache-dtype: {values: [auto, fp8], numerics: maybe}  #!\n",
     ["levers.kv-cache-dtype: ", "preserving or changing"]),
    ("lever-twice", "levers:\n  max-num-seqs: [2, 4]\n  --max-num-seqs: [3]  #!\n", ["the same lever as 'max-num-seqs'"]),
    ("objective-unknown", "objective: fastest  #!\n", ["objective: objective 'fastest' is not one of"]),
    ("goodput-without-sweep", "objective: goodput_at_slo\nmeasure:\n  sweep: false  #!\n",
     ["measure.sweep: objective goodput_at_slo is the sweep's goodput"]),
    ("sweep-bad-level", "measure:\n  sweep: {levels: [0, 2]}  #!\n", ["measure.sweep.levels.0: should be greater than"]),
    ("sweep-bad-key", "measure:\n  sweep:\n    slo_ttft: 1  #!\n", ["measure.sweep.slo_ttft: unknown key; did you mean"]),
    ("telemetry-top-inert", "telemetry: true  #!\n", ["telemetry: top-level telemetry is not read"]),
    ("depths-string", "measure:\n  depths: '166'  #!\n", ["measure.depths: should be a valid list"]),
    ("depths-zero", "measure:\n  depths: [166, 0]  #!\n", ["measure.depths.1: should be greater than or equal to 1"]),
    ("depths-empty", "measure:\n  depths: []  #!\n", ["measure.depths: "]),
    ("search-mode", "search: random  #!\n", ["search: should be 'one-change' or 'joint'"]),
    ("production-no-unit", "production:  #!\n  guard: refuse-if-active\n", ["production.unit: required key is missing"]),
    ("production-guard", "production:\n  unit: x.service\n  guard: yolo  #!\n", ["production.guard: should be"]),
    ("production-scope", "production:\n  unit: x.service\n  scope: global  #!\n", ["production.scope: should be"]),
    ("constraints-min-slots", "constraints:\n  min_slots: 1.5  #!\n", ["constraints.min_slots: should be a valid integer"]),
    ("constraints-concurrency", "constraints:\n  max_concurrency_at: {tokens: 200704}  #!\n",
     ["constraints.max_concurrency_at.min: required key is missing"]),
    ("engine-newer-string", "engine_newer: 'yes'  #!\n", ["engine_newer: should be a valid boolean"]),
    ("duplicate-key", "budget: {max_arms: 3}\nbudget: {max_arms: 4}  #!\n", ["not valid YAML: key 'budget' is given twice"]),
    ("not-a-mapping-levers", "levers: [a, b]  #!\n", ["levers: should be a valid dictionary"]),
    ("many-at-once", "noise:\n  confirm: 'no'  #!\n  min_effect: 2  #!\nbudget:\n  max_arms: 0  #!\nboot:\n  hang_s: abc  #!\n",
     ["noise.confirm", "noise.min_effect", "budget.max_arms", "boot.hang_s"]),
]

BASELINE_CASES = [
    ("port-range", HEAD.replace("  model: /models/sim\n", "  model: /models/sim\n  port: 99999  #!\n"),
     ["baseline.port: should be less than or equal to 65535"]),
    ("image-missing", HEAD.replace("  image: localhost/offload-tuner-simengine:latest\n", "") .replace("baseline:\n", "baseline:  #!\n"),
     ["baseline.image: required key is missing"]),
    ("engine-missing-profile", HEAD.replace("engine: vllm-expert-offload\n", "engine: vllm-nope  #!\n"),
     ["engine: engine profile 'vllm-nope' not found"]),
    ("name-bad", HEAD.replace("name: schema-test\n", "name: has space  #!\n"), ["name: must be 1-64 letters"]),
    ("name-missing", HEAD.replace("name: schema-test\n", "# no name  #!\n"), ["name: required key is missing"]),
    ("baseline-key-typo", HEAD.replace("  model: /models/sim\n", "  model: /models/sim\n  imgae: x  #!\n"),
     ["baseline.imgae: unknown key; did you mean 'image'?"]),
    ("env-list", HEAD.replace("  env: {R4D_LRU_GATHER_CHUNKS: 8}\n", "  env: {R4D_LRU_GATHER_CHUNKS: [8]}  #!\n"),
     ["baseline.env.R4D_LRU_GATHER_CHUNKS: "]),
]


def _check(tmp_path, capsys, name, text, wants):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    rc = cli.main(["check", str(path)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    errors = [ln[len("tuner: error: "):] for ln in err.splitlines() if ln.startswith("tuner: error: ")]
    marked = {i for i, ln in enumerate(text.splitlines(), 1) if ln.rstrip().endswith("#!")}
    got_lines = set()
    for e in errors:
        m = re.match(rf"^{re.escape(str(path))}:(\d+): (\S+)(: | )", e)
        assert m, f"not FILE:LINE: KEY: message: {e}"
        got_lines.add(int(m.group(1)))
    assert got_lines == marked, err
    for want in wants:
        assert any(want in e for e in errors), f"{want!r} not in:\n{err}"
    assert "does not answer" not in err, "validation must come before any service is contacted"
    return errors


@pytest.mark.parametrize("name,body,wants", CASES, ids=[c[0] for c in CASES])
def test_malformed_campaign(tmp_path, capsys, monkeypatch, name, body, wants):
    monkeypatch.setenv("CONTAINER_HOST", "unix:///nonexistent.sock")
    _check(tmp_path, capsys, name, HEAD + body, wants)


@pytest.mark.parametrize("name,text,wants", BASELINE_CASES, ids=[c[0] for c in BASELINE_CASES])
def test_malformed_baseline(tmp_path, capsys, monkeypatch, name, text, wants):
    monkeypatch.setenv("CONTAINER_HOST", "unix:///nonexistent.sock")
    _check(tmp_path, capsys, name, text, wants)


def test_all_errors_of_a_file_at_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CONTAINER_HOST", "unix:///nonexistent.sock")
    body = ("levers:\n  expert-prefech: [1, 2]  #!\n  max-num-seqs: [2, 4]\n"
            "noise: {confirm: 'false', prune_below: 5}  #!\nbudget:\n  max_arms: 2.7  #!\n")
    errors = _check(tmp_path, capsys, "all", HEAD + body, ["expert-prefech", "noise.confirm", "noise.prune_below",
                                                             "budget.max_arms"])
    assert len(errors) == 4


def test_lever_typo_names_the_flag_and_an_env_typo_warns(tmp_path, capsys, caplog, monkeypatch):
    monkeypatch.setenv("CONTAINER_HOST", "unix:///nonexistent.sock")      # podman does not answer
    path = tmp_path / "typo.yaml"
    path.write_text(HEAD + "levers:\n  env.R4D_LRU_GATHR_CHUNKS: [8, 16]\n  max-num-seqs: [2, 4]\n")
    from tuner.night.campaign import load_campaign

    camp = load_campaign(path)                      # an env typo is a warning: the engine may read it
    assert set(camp.levers) == {"env.R4D_LRU_GATHR_CHUNKS", "max-num-seqs"}
    rc = cli.main(["check", str(path)])            # then podman does not answer: the file is valid, exit 4
    err = capsys.readouterr().err + caplog.text
    assert rc == cli.EXIT_NOT_PINNED == 4
    assert "valid, but its image is not pinned to a digest" in err and "nonexistent.sock does not answer" in err
    assert f"{path}:8: levers.env.R4D_LRU_GATHR_CHUNKS: env var R4D_LRU_GATHR_CHUNKS is not in baseline.env" in err
    assert "did you mean env.R4D_LRU_GATHER_CHUNKS?" in err
    # a flag the profile does not know is fine when the campaign says the engine is newer
    path.write_text(HEAD + "engine_newer: true\nlevers:\n  expert-prefech: [1, 2]\n")
    assert "expert-prefech" in load_campaign(path).levers


def test_alias_bomb_is_refused_cheaply(tmp_path, capsys):
    rows = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, (x, y) in enumerate(zip("bcdefghi", "abcdefgh")):
        rows.append(f"{x}: &{x} [" + ",".join([f"*{y}"] * 9) + "]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(rows) + "\nname: bomb\n")
    t0 = time.monotonic()
    rc = cli.main(["check", str(path)])
    assert rc == 2 and time.monotonic() - t0 < 5
    assert "aliases expand to more than" in capsys.readouterr().err


def test_until_is_dst_safe():
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from tuner.night.campaign import Budget

    berlin = ZoneInfo("Europe/Berlin")
    b = Budget(until=(7, 0), timezone="Europe/Berlin")
    # the night the clocks go back (2026-10-25 03:00 CEST -> 02:00 CET): 22:00 -> 07:00 is 10 hours
    start = datetime(2026, 10, 24, 22, 0, tzinfo=berlin).timestamp()
    assert b.until_epoch(start) - start == 10 * 3600
    end = datetime.fromtimestamp(b.until_epoch(start), berlin)
    assert (end.hour, end.minute, end.day) == (7, 0, 25)
    # spring forward (2026-03-29): 22:00 -> 07:00 is 8 hours
    start = datetime(2026, 3, 28, 22, 0, tzinfo=berlin).timestamp()
    assert b.until_epoch(start) - start == 8 * 3600
    # an ordinary night, and a start after midnight (same day)
    start = datetime(2026, 6, 1, 1, 30, tzinfo=berlin).timestamp()
    assert b.until_epoch(start) - start == 5.5 * 3600


def test_json_schema_is_committed_and_current():
    from tuner.night.schema import json_schema

    committed = json.loads((REPO / "docs" / "campaign.schema.json").read_text())
    assert committed == json_schema(), "run `tuner schema > docs/campaign.schema.json`"
    assert committed["properties"]["noise"]["$ref"].endswith("Noise")


def test_cli_subprocess_refuses_with_exit_2_and_no_traceback(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(HEAD + "noise: {confirm: 'false'}\nbudget: {max_arms: 2.7}\n")
    r = subprocess.run([sys.executable, "-m", "tuner.cli", "run", str(path)], cwd=REPO, capture_output=True,
                       text=True, timeout=60, env={"CONTAINER_HOST": "unix:///nonexistent.sock", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert [ln.split(": ")[3] for ln in r.stderr.splitlines()] == ["noise.confirm", "budget.max_arms"], r.stderr
