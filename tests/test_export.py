"""`tuner export` (one flat row per arm) and `tuner dashboard` (issue 7, item 2), on a night the
campaign code ran (tests/report_journals.py)."""
from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time

import httpx
import pandas as pd
import pytest

from arms.errors import ConfigError
from report_journals import REPO, finished, records, simulated_night, starts
from tuner.cli import main
from tuner.morning.export import export

REQUIRED = ["arm", "kind", "change_lever", "change_value", "verdict", "delta", "objective", "feasible", "violation",
            "decode_166", "decode_1087", "mad_166", "mad_1087", "ttft_166", "ttft_1087", "acceptance",
            "boot_outcome", "boot_s", "compile_s", "compile_cache_hit", "slots", "kv_pool_tokens",
            "max_concurrency", "quality", "telemetry_precision", "arm_s", "t_start", "t_end"]
READ = {"csv": pd.read_csv, "jsonl": lambda p: pd.read_json(p, lines=True), "parquet": pd.read_parquet}


@pytest.fixture(scope="session")
def night(tmp_path_factory):
    return simulated_night(tmp_path_factory.mktemp("night"))


def same(a, b) -> bool:
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return a is None or pd.isna(a)
    if isinstance(b, float):
        return math.isclose(float(a), b, rel_tol=1e-9)
    return a == b or str(a) == str(b)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_one_flat_row_per_arm_with_the_journals_numbers(night, fmt, tmp_path):
    path = export(night, fmt, tmp_path / f"arms.{fmt}")
    df = READ[fmt](path).set_index("arm", drop=False)
    recs = records(night)
    ends, st = finished(recs), starts(recs)
    assert len(df) == len(st) and list(df["arm"]) == sorted(st)
    assert [c for c in REQUIRED if c not in df.columns] == []
    for n, end in ends.items():
        row = df.loc[n]
        boot = end.get("boot") or {}
        rep = boot.get("report") or {}
        ch = st[n]["change"]
        assert same(row["verdict"], end["verdict"]) and same(row["kind"], st[n]["kind"])
        assert same(row["change_lever"], ch[0] if ch else None)
        if ch:
            assert row["change_value"] == ("absent" if ch[1] == {"__absent__": True}
                                           else json.dumps(ch[1], separators=(",", ":")) if isinstance(ch[1], dict)
                                           else str(ch[1]).lower() if isinstance(ch[1], bool) else str(ch[1]))
        assert same(row["objective"], (end.get("score") or {}).get("objective"))
        assert same(row["delta"], end.get("delta"))
        assert same(row["boot_s"], boot.get("boot_s")) and same(row["boot_outcome"], boot.get("outcome"))
        assert same(row["slots"], (rep.get("plan") or {}).get("slots"))
        assert same(row["kv_pool_tokens"], rep.get("kv_pool_tokens"))
        assert same(row["compile_cache_hit"], rep.get("compile_cache_hit"))
        assert same(row["t_start"], st[n]["t"]) and same(row["t_end"], end["t"])
        for d, m in ((end.get("measurement") or {}).get("depths") or {}).items():
            assert same(row[f"decode_{d}"], m["median_decode_tok_s"])
            assert same(row[f"ttft_{d}"], m["median_ttft_s"])
        tel = ((end.get("telemetry") or {}).get("report") or {}).get("summary") or {}
        assert same(row["telemetry_precision"], tel.get("precision"))
    if fmt == "parquet":
        assert str(df["slots"].dtype) == "Int64" and str(df["feasible"].dtype) == "boolean"


def test_cli_export_prints_where_it_wrote(night, capsys):
    assert main(["export", str(night), "--format", "jsonl"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(night / "arms.jsonl")
    assert sum(1 for _ in open(out)) == len(starts(records(night)))


def test_parquet_without_pyarrow_names_the_install(night, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)            # `import pyarrow` now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install pyarrow"):
        export(night, "parquet", tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()


def test_bad_input(night, tmp_path, capsys):
    with pytest.raises(ConfigError, match="csv, jsonl, parquet"):
        export(night, "xml")
    with pytest.raises(ConfigError, match="no journal.jsonl"):
        export(tmp_path, "csv")
    assert main(["export", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# -- dashboard ---------------------------------------------------------------------------------
def test_optuna_dashboard_opens_the_campaign_storage_and_lists_its_trials(night):
    from optuna.trial import TrialState
    from optuna_dashboard._storage_url import get_storage     # how optuna-dashboard picks a storage from a path

    from tuner.morning.dashboard import storage, study_path

    path = study_path(night)
    guessed = get_storage(str(path))
    assert type(guessed) is type(storage(path))
    assert type(guessed._backend) is type(storage(path)._backend)
    (study,) = guessed.get_all_studies()
    assert study.study_name == "report-night"
    trials = guessed.get_all_trials(study._study_id)
    recs = records(night)
    ends, st = finished(recs), starts(recs)
    assert len(trials) == len(st)
    by_number = {t.number: t for t in trials}
    moved = {r["arm"] for r in recs if r["op"] == "incumbent"} | {min(ends)}    # the baseline, then each move
    for n, end in ends.items():
        t = by_number[st[n]["trial"]]
        obj = (end.get("score") or {}).get("objective")
        told = end["verdict"] not in ("interrupted", "invalid", "corrupt") and not end["verdict"].startswith("boot-failed")
        if not told or obj is None:
            assert t.state == TrialState.FAIL
        elif n in moved:            # the incumbent's chained value: the study's best is the incumbent
            assert t.state == TrialState.COMPLETE
        else:                       # every other arm: PRUNED, its objective the step-0 intermediate value
            assert t.state == TrialState.PRUNED and math.isclose(t.intermediate_values[0], obj)
    last = max(r["arm"] for r in recs if r["op"] == "incumbent")
    best = max((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    assert best.number == st[last]["trial"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dashboard_serves_api_studies_on_loopback(night):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "dashboard", str(night), "--port", str(port)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline, body = time.monotonic() + 30, None
        with httpx.Client(trust_env=False, timeout=2.0) as http:
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    r = http.get(f"http://127.0.0.1:{port}/api/studies")
                    if r.status_code == 200:
                        body = r.json()
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
        assert body is not None, f"dashboard did not answer: {proc.poll()}"
        assert [s["study_name"] for s in body["study_summaries"]] == ["report-night"]
        listening = [c for c in __import__("psutil").Process(proc.pid).net_connections("tcp") if c.status == "LISTEN"]
        assert listening and all(c.laddr.ip == "127.0.0.1" for c in listening)
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_dashboard_refuses_a_busy_port_and_a_folder_without_a_study(night, tmp_path):
    from tuner.morning.dashboard import serve

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ConfigError, match="in use"):
            serve(night, s.getsockname()[1])
    (tmp_path / "journal.jsonl").write_text(json.dumps(records(night)[0]) + "\n")
    with pytest.raises(ConfigError, match="optuna.journal does not exist"):
        serve(tmp_path, _free_port())
