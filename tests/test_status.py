"""`tuner status` for a person: 80 columns, a summary line first, pruned and unconfirmed arms
said as such, --json complete, no traceback on a closed pipe; --version; every command's help."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.report_journals import REPO, simulated_night
from tuner.cli import build_parser


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    return simulated_night(tmp_path_factory.mktemp("status"))


def tuner(*args, env=None, shell=None):
    if shell:
        return subprocess.run(["bash", "-o", "pipefail", "-c", shell], cwd=REPO, capture_output=True, text=True,
                              timeout=120, env={**os.environ, **(env or {})})
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_status_fits_80_columns_with_a_summary_first(night):
    r = tuner("status", str(night), env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(x) for x in lines) <= 80, max(lines, key=len)
    assert lines[0].startswith("report-night: ended; ") and " arms; decode_geomean " in lines[0]
    assert "vs baseline" in lines[0]
    assert lines[1].startswith("incumbent: ") and "→" in lines[1]        # changes, not a hash
    table = lines[lines.index("") + 1:]
    assert table[0].split()[:4] == ["arm", "kind", "change", "verdict"]
    assert any(" pruned" in x for x in table), "a pruned arm is said as such"
    assert any("better (confirmed)" in x for x in table)
    assert any(" undecided" in x for x in table), "a comparison that is not decided yet is said as such"
    assert len(table) >= 31


def test_status_wide_has_every_column(night):
    r = tuner("status", str(night), "--wide")
    assert r.returncode == 0
    header = [x for x in r.stdout.splitlines() if x.startswith("arm ")][0]
    assert "boot s" in header and "reason" in header
    assert any("pruned after depth" in x for x in r.stdout.splitlines())


def test_status_json_is_complete(night):
    d = json.loads(tuner("status", str(night), "--json").stdout)
    assert d["arms"] == len(d["arm_list"]) >= 30
    assert {"arm", "kind", "change", "verdict", "label", "objective", "delta", "reason"} <= set(d["arm_list"][0])
    assert d["objective"] == "decode_geomean" and d["incumbent_objective"] > d["baseline_objective"] > 0
    assert d["gain"] == pytest.approx(d["incumbent_objective"] / d["baseline_objective"] - 1)
    assert d["state"] == "ended" and d["phase"] == "ended" and "deadline" in d and d["incumbent_changes"]


def test_closed_pipe_is_not_a_traceback(night):
    r = tuner(shell=f"{sys.executable} -m tuner.cli status {night} | head -1")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and r.stdout.startswith("report-night:")


def test_version_and_every_command_says_what_it_does():
    r = tuner("--version")
    assert r.returncode == 0 and r.stdout.startswith("tuner ")
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, parser in sub.choices.items():
        assert parser.description and len(parser.description) > 20, name
        if name not in ("run", "dashboard", "schema"):       # result-producing commands take --json
            assert "--json" in parser.format_help(), name


def test_a_better_probe_without_its_confirmation_is_unconfirmed(night, tmp_path):
    import shutil

    from tests.report_journals import records, write_journal

    recs = records(night)
    probe = next(r for r in recs if r["op"] == "arm_end" and r["verdict"] == "better" and r["kind"] == "probe")
    cut = [r for r in recs if not (r.get("arm", -1) > probe["arm"] or r["op"] in ("campaign_end", "incumbent"))]
    folder = tmp_path / "night"
    shutil.copytree(night, folder)
    write_journal(folder, cut)
    r = tuner("status", str(folder))
    row = [x for x in r.stdout.splitlines() if x.lstrip().startswith(f"{probe['arm']} ")]
    assert row and "better (unconfirmed)" in row[0], r.stdout


def test_values_of_one_lever_are_told_apart_in_80_columns(night):
    """Arms whose changes share a long prefix (a JSON-valued lever) show the part that differs."""
    from tests.report_journals import records

    recs = records(night)
    by_text: dict[str, set[int]] = {}
    for r in recs:
        if r["op"] == "arm_start" and r.get("change"):
            by_text.setdefault(json.dumps(r["change"], sort_keys=True), set()).add(r["arm"])
    r = tuner("status", str(night), env={"COLUMNS": "80"})
    lines = r.stdout.splitlines()
    header = next(x for x in lines if x.startswith("arm "))
    rows = {int(x.split()[0]): x for x in lines[lines.index(header) + 1:] if x[:4].strip().isdigit()}
    c0, c1 = header.index("change"), header.index("verdict")
    cell = {n: row[c0:c1].strip() for n, row in rows.items()}
    spec = {t: ns for t, ns in by_text.items() if "speculative-config" in t}
    assert len(spec) >= 3, "the night tries several values of the JSON-valued lever"
    seen: dict[str, str] = {}
    for t, ns in by_text.items():
        cells = {cell[n] for n in ns}
        assert len(cells) == 1, (t, cells)              # one change, one name
        name = cells.pop()
        assert name not in seen, f"{t} and {seen.get(name)} both read {name!r}"
        seen[name] = t


def test_value_names_show_the_keys_that_differ_and_cuts_keep_what_differs():
    from arms.shape import ABSENT
    from tuner.morning.change_names import ValueNames, fit

    vals = [{"method": "mtp", "num_speculative_tokens": 4}, {"method": "mtp", "num_speculative_tokens": 3},
            {"method": "mtp", "num_speculative_tokens": 6}, {"method": "ngram", "num_speculative_tokens": 4}, ABSENT]
    names = ValueNames([("speculative-config", v) for v in vals] + [("threads", 2)])
    got = [names.value("speculative-config", v) for v in vals]
    assert got == ['{"method":"mtp","num_speculative_tokens":4}',       # differs from two siblings in two keys
                   "{… num_speculative_tokens: 3}", "{… num_speculative_tokens: 6}", "{… method: ngram}", "absent"]
    assert names.value("threads", 2) == "2"
    assert ValueNames([("x", {"a": 1, "b": 2})]).value("x", {"a": 1, "b": 2}) == '{"a":1,"b":2}'   # no sibling: all of it
    changes = [names.change("speculative-config", v) for v in vals]
    long = ['override-tensor → blk\\.(1[0-9])\\.ffn_.*_exps\\.=CPU', 'override-tensor → blk\\.(2[0-9])\\.ffn_.*_exps\\.=CPU',
            "a long text with no arrow, number 1", "a long text with no arrow, number 2", "short"]
    for texts in (changes, long):
        for width in (12, 16, 20, 25, 32, 40, 80):
            out = fit(texts, width)
            assert all(len(x) <= width for x in out), (width, out)
            assert len(set(out)) == len(set(texts)), (width, out)      # different texts stay different
            assert [x for x, t in zip(out, texts) if len(t) <= width] == [t for t in texts if len(t) <= width]
    assert fit(changes, 25)[1:3] == ["specu… → …tokens: 3}", "specu… → …tokens: 6}"]
