"""`tuner report`: the morning report of a campaign (issue 7, item 1).

Every journal here was written by the campaign code (tests/report_journals.py), or is one of
those records cut or extended by hand; the assertions recompute what the report should say
from the records themselves.
"""
from __future__ import annotations

import base64
import json
import math
import re
import shutil
from dataclasses import replace

import pytest

from arms.errors import ConfigError
from arms.shape import Shape
from report_journals import finished, load_bench, records, simulated_night, starts, write_journal
from tuner.cli import main
from tuner.morning.report import _span, _words, build_report, render_html, render_markdown, write_report


@pytest.fixture(scope="session")
def night(tmp_path_factory):
    return simulated_night(tmp_path_factory.mktemp("night"))


@pytest.fixture(scope="session")
def report_md(night):
    return write_report(night)


def section(md: str, title: str) -> str:
    return md.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def row_of(text: str, n: int) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| #{n} "))


def test_cli_writes_report_files_and_prints_the_markdown(night, report_md, capsys):
    assert main(["report", str(night)]) == 0
    out = capsys.readouterr().out
    assert out == (night / "REPORT.md").read_text()
    assert out.startswith("# Morning report: report-night")
    for name in ("decode_vs_depth", "objective", "timeline"):
        assert (night / "report" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](report/{name}.png)" in out
    assert (night / "report.html").exists()


def test_headline_incumbents_gain_wall_time_and_recommended_shape(night, report_md):
    recs = records(night)
    head = section(report_md, "Headline")
    ends, moves = finished(recs), [r for r in recs if r["op"] == "incumbent"]
    assert moves, "the simulated night moves the incumbent"
    assert f"{len(starts(recs)):,} arms ({len(ends):,} finished)" in head
    assert _span(recs[-1]["t"] - recs[0]["t"]) in head
    base = ends[0]["score"]["objective"]
    assert f"the production shape (`{Shape.from_dict(recs[0]['baseline']).key()}`, arm #0) — {base:,.2f} tok/s" in head
    final = Shape.from_dict(moves[-1]["shape"])
    assert f"`{final.key()}` after {len(moves)} move(s)" in head
    *first, last = [f"#{n}" for n in moves[-1]["confirmed_arms"]]
    assert first and last == f"#{moves[-1]['arm']}"
    assert f"(arms {', '.join(first)} and {last})" in head
    m = re.search(r"\*\*([+-]\d+\.\d)%\*\* against the start \(noise band ±(\d+\.\d)%", head)
    assert m and float(m.group(1)) > 0
    for change in Shape.from_dict(recs[0]["baseline"]).diff(final):
        assert f"- {_words(change)}" in head


def test_arm_table_grouped_as_the_seed_with_decode_per_depth(night, report_md):
    recs = records(night)
    arms = section(report_md, "Arms")
    heads = [h for h in ("Incumbent moves", "Baseline and re-checks", "Parity", "Worse", "Failed")]
    pos = [arms.index(f"### {h}") for h in heads]
    assert pos == sorted(pos)
    ends, moves = finished(recs), [r for r in recs if r["op"] == "incumbent"]
    for n, end in ends.items():            # every arm once, with its own numbers
        assert arms.count(f"| #{n} ") == 1
        row = row_of(arms, n)
        for depth, d in (end.get("measurement") or {}).get("depths", {}).items():
            v = d["median_decode_tok_s"]
            if v is not None:
                assert f"{v:,.2f}" in row
    last = moves[-1]["arm"]
    assert "**NEW INCUMBENT**" in row_of(arms, last)
    assert f"confirmed by #{last}" in row_of(arms, moves[-1]["confirmed_arms"][0])
    assert "| acceptance |" in arms and "TTFT s (166 / 1087)" in arms
    for n, end in ends.items():
        if end["verdict"].startswith("boot-failed:"):
            assert f"boot failed: {end['verdict'].split(':', 1)[1]}" in row_of(arms, n)
        if end["verdict"] == "parity":
            assert "parity" in row_of(arms, n)


def test_failures_grouped_by_class_with_the_engine_line_and_boot_log(night, report_md):
    fails = section(report_md, "Failures")
    bad = {n: e for n, e in finished(records(night)).items() if e["verdict"].startswith("boot-failed:")}
    assert len({e["verdict"] for e in bad.values()}) >= 4
    for n, end in bad.items():
        assert f"### {end['verdict'].split(':', 1)[1]} — " in fails
        assert end["boot"]["evidence"][0] in fails
        link = f"arms/{n:04d}/boot.log"
        assert f"[boot log]({link})" in fails and (night / link).exists()


def test_memory_plan_as_deltas_against_the_incumbent(night, report_md):
    recs = records(night)
    mem = section(report_md, "Memory plan")
    ends, st = finished(recs), starts(recs)
    ref = {Shape.from_dict(recs[0]["baseline"]).key(): 0}
    ref.update({Shape.from_dict(m["shape"]).key(): m["arm"] for m in recs if m["op"] == "incumbent"})
    slots = {n: ((e.get("boot") or {}).get("report") or {}).get("plan", {}).get("slots") for n, e in ends.items()}
    checked = 0
    for n in ends:
        r = ref.get(st[n]["incumbent"])
        if n in ref.values() or r is None or f"| #{n} " not in mem or None in (slots[n], slots[r]):
            continue
        d = slots[n] - slots[r]
        want = f"{slots[n]:,}" + ("" if d == 0 else f" ({'+' if d > 0 else '−'}{abs(d):,})")
        assert row_of(mem, n).split(" | ")[1] == want
        checked += d != 0
    assert checked, "some arm moved the arena against its incumbent"
    assert "| expert cache space |" in mem and "| KV pool |" in mem and "compile cache" in mem


def test_quality_guard_telemetry_and_constraints_in_words(night, report_md):
    recs = records(night)
    ends = finished(recs)
    corrupt = [n for n, e in ends.items() if e["verdict"] == "corrupt"]
    assert corrupt
    q = section(report_md, "Quality guard")
    for n in corrupt:
        assert ends[n]["quality"]["evidence"][0] in q
        assert re.search(r"\| \(\d[\d,]*\.\d\d\*\) \|", row_of(section(report_md, "Arms"), n))
    tel = section(report_md, "Telemetry")
    windows = [e["telemetry"]["status"] for e in ends.values() if e.get("telemetry")]
    assert f"{len(windows):,} arms opened a telemetry window" in tel
    base_ok = [e for n, e in ends.items() if e.get("telemetry", {}).get("status") == "ok" and starts(recs)[n]["kind"] == "baseline"]
    for e in base_ok:
        assert e["telemetry"]["findings"][0] in tel          # e.g. "prefetch precision 36 %: ~0.56 GB per step ..."
    con = section(report_md, "Constraints")
    broke = sum("min_slots" in (e.get("violations") or {}) for e in ends.values())
    assert f"arena ≥ 6,600 slots: met by the incumbent; broken by {broke:,} arm(s)" in con
    assert "max concurrency ≥ 2x at 32,768 tokens" in con and "boot ≤ 600 s" in con


def test_html_is_self_contained(night, report_md):
    html = (night / "report.html").read_text()
    imgs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(imgs) == 3 and all(base64.b64decode(i)[:4] == b"\x89PNG" for i in imgs)
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "<script" not in html and "<link" not in html
    assert "<table" in html and "NEW INCUMBENT" in html


def test_no_finished_arms_is_one_clear_line(night, tmp_path, capsys):
    recs = records(night)
    write_journal(tmp_path / "early", [r for r in recs if r["op"] == "campaign_start"] + [starts(recs)[0]])
    with pytest.raises(ConfigError, match="no finished arms yet"):
        build_report(tmp_path / "early")
    assert main(["report", str(tmp_path / "early")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no finished arms" in err
    with pytest.raises(ConfigError, match="no journal.jsonl"):
        build_report(tmp_path)


def test_running_arm_and_torn_tail_read_without_touching_the_journal(night, tmp_path):
    recs = records(night)
    cut = [r for r in recs if r["op"] != "campaign_end"]
    nxt = dict(starts(recs)[max(starts(recs))], arm=max(starts(recs)) + 1, seq=cut[-1]["seq"] + 1)
    folder = tmp_path / "live"
    path = write_journal(folder, cut + [nxt], tail=b'{"op":"arm_end","seq":9')
    before = path.read_bytes()
    md = render_markdown(build_report(folder))
    assert path.read_bytes() == before
    assert f"Running now: #{nxt['arm']} " in md
    assert "The campaign has not ended" in md


def test_ten_thousand_arm_style_night_is_summarised(tmp_path):
    bench = load_bench()
    folder = tmp_path / "big"
    bench.synthesize(folder, arms=700, seed=5)
    rep = build_report(folder)
    md = render_markdown(rep)
    arms = section(md, "Arms")
    shown = len(re.findall(r"^\| #\d+ ", arms, flags=re.M))
    more = sum(int(x.replace(",", "")) for x in re.findall(r"… and ([\d,]+) more in “", arms))
    assert more > 0 and shown + more == 700
    assert all(len(re.findall(r"^\| #\d+ ", t, flags=re.M)) <= 25 for t in arms.split("### ")[1:])
    assert "… and" in section(md, "Memory plan") and "… and" in section(md, "Failures")
    html = render_html(rep)
    assert html.count("data:image/png;base64,") == 3
    shutil.rmtree(folder)


def test_an_arm_cut_by_a_crash_is_reported_as_interrupted(night, tmp_path):
    recs = [r for r in records(night) if r["op"] != "campaign_end"]
    last = max(starts(recs))
    nxt = dict(starts(recs)[last], arm=last + 1, seq=recs[-1]["seq"] + 1)
    # what CampaignLoop._start journals on resume for an arm the tuner died in
    cut = {"op": "arm_end", "seq": nxt["seq"] + 1, "t": nxt["t"] + 5, "arm": last + 1, "kind": nxt["kind"],
           "verdict": "interrupted", "reason": "the tuner stopped mid-arm; its container was removed on resume",
           "orphans_removed": 1}
    write_journal(tmp_path / "crashed", recs + [nxt, cut])
    md = render_markdown(build_report(tmp_path / "crashed"))
    assert "interrupted — the tuner stopped mid-arm" in row_of(section(md, "Arms"), last + 1)
    fails = section(md, "Failures")
    assert "### interrupted — 1 arm(s)" in fails and cut["reason"] in fails


def test_html_refuses_unsafe_links_and_raw_html(night):
    from tuner.morning.report_model import Section

    rep = build_report(night)
    rep.sections.insert(0, Section("Engine text").add("p", "evidence: [click](javascript:alert(1)) and "
                                                           "<script>alert(2)</script> and [log](arms/0001/boot.log)")
                        .add("ul", ["[x](vbscript:msgbox)", "<img src=x onerror=alert(3)>"]))
    html = render_html(rep)
    assert 'href="javascript' not in html and 'href="vbscript' not in html
    assert "<script" not in html and "<img src=x" not in html and "&lt;script&gt;" in html
    assert '<a href="arms/0001/boot.log">log</a>' in html          # a relative link still works


def test_report_without_matplotlib_says_so_in_one_line(night, tmp_path, monkeypatch):
    import sys

    for mod in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, mod, None)
    monkeypatch.delitem(sys.modules, "tuner.morning.report_plots", raising=False)
    folder = tmp_path / "night"
    shutil.copytree(night, folder)
    shutil.rmtree(folder / "report", ignore_errors=True)
    md = write_report(folder)
    notes = [x for x in md.splitlines() if "plots skipped: matplotlib is not installed" in x]
    assert len(notes) == 3 and not list((folder / "report").glob("*.png"))
    assert "data:image/png" not in (folder / "report.html").read_text()


def test_report_and_status_print_the_journaled_band_incumbent_value_and_error_rate(night, report_md, capsys):
    """The report's incumbent value, noise band, decision band, error rate and comparison
    intervals are the journal's (campaign_end's ``judged``, the compare records), the same
    numbers `tuner status --json` gives, and the loop's own (a fresh replay agrees)."""
    from tuner.night.state import replay

    recs = records(night)
    end = next(r for r in reversed(recs) if r["op"] == "campaign_end")
    j = end["judged"]
    min_effect = recs[0]["campaign"]["noise"]["min_effect"]
    assert replay(recs, Shape.from_dict(recs[0]["baseline"])).judged(min_effect) == j
    head = section(report_md, "Headline")
    assert f"— {j['incumbent_value']:,.2f} tok/s" in head
    assert f"noise band ±{j['noise_band']:.1%} from {j['measures']} measures of the incumbent" in head
    assert f"a change had to beat ±{j['band']:.1%}, promotions at a family error rate of {end['error_rate']:g}" in head
    assert main(["status", str(night), "--json"]) == 0
    import json

    st = json.loads(capsys.readouterr().out)
    assert st["incumbent_objective"] == j["incumbent_value"] and st["judged"] == j
    assert st["error_rate"] == end["error_rate"]
    assert f"**{st['gain']:+.1%}** against the start" in head
    # the plot's incumbent and band: each arm's journaled judgement, then the final one
    by_arm = {r["arm"]: r for r in recs if r["op"] == "arm_start"}
    want = [(r["t"], by_arm[r["arm"]]["judged"]["incumbent_value"], by_arm[r["arm"]]["judged"]["band"])
            for r in finished(recs).values() if by_arm[r["arm"]]["judged"]["incumbent_value"] is not None]
    got = [(p["t"], p["incumbent"], p["band"]) for p in build_report(night).plots["series"]]
    assert got == want + [(end["t"], j["incumbent_value"], j["band"])]
    how = section(report_md, "How sure")
    for m in (r for r in recs if r["op"] == "incumbent" and r.get("comparison")):
        c = m["comparison"]
        row = next(line for line in how.splitlines() if line.startswith(f"| arm {m['arm']} |"))
        assert f"{c['effect']:+.1%} [{c['lo']:+.1%}, {c['hi']:+.1%}]" in row and f"| {c['alpha']:.2g} |" in row


def test_how_sure_says_what_the_box_could_show_from_the_last_blocked_comparison(night, tmp_path):
    """The boot spread, run noise and error rate of the night's last blocked comparison, and what
    they cost: the same journal with that spread raised by hand reads a spread box, larger moves
    only, and more boots for the smallest one worth a move (tuner/night/power.py)."""
    from tuner.night.power import BoxNoise, boots_for, shown_at
    from tuner.night.search import REEXAMINE_CAP

    def could(folder):
        how = section(render_markdown(build_report(folder)), "How sure")
        return next(line for line in how.splitlines() if line.startswith("What this box could show"))

    recs = records(night)
    last = next(r["comparison"] for r in reversed(recs) if r["op"] == "compare" and "boot_sigma" in r["comparison"])
    promo = next(r["comparison"]["alpha"] for r in reversed(recs) if r["op"] == "compare"
                 and r.get("kind") == "bracketed")
    assert promo != last["alpha"]          # the last promotion look is an earlier look than the last comparison
    noise = replace(BoxNoise.of(last), alpha=promo)
    line = could(night)
    assert f"from {noise.pairs} pair(s)" in line and f"promotion look's error rate ({noise.alpha:.2g})" in line
    assert f"shows a move of {shown_at(REEXAMINE_CAP, noise.s2, noise.alpha, noise.df):+.1%} or more" in line
    before = int(re.search(r"would need about (\d+) boots", line).group(1))
    assert before == boots_for(0.02, noise.s2, noise.alpha, df=noise.df)
    folder = tmp_path / "spread"
    shutil.copytree(night, folder)
    last["boot_sigma"] = 0.05
    write_journal(folder, recs)
    line = could(folder)
    assert "boots of one shape spread 5.0% beyond their runs' noise" in line
    after = re.search(r"would need about (\d+) boots|would need more boots than any night holds", line)
    assert after and (after.group(1) is None or int(after.group(1)) > before)


def test_report_reads_the_judgement_it_never_recomputes_it(night, tmp_path, capsys):
    """Journaled numbers changed by hand are what the report and status print."""
    folder = tmp_path / "night"
    shutil.copytree(night, folder)
    recs = records(folder)
    end = next(r for r in reversed(recs) if r["op"] == "campaign_end")
    end["judged"] = {**end["judged"], "incumbent_value": 123.456, "noise_band": 0.0771, "band": 0.0812, "measures": 9}
    end["error_rate"] = 0.01
    write_journal(folder, recs)
    head = section(render_markdown(build_report(folder)), "Headline")
    assert "— 123.46 tok/s" in head and "noise band ±7.7% from 9 measures" in head
    assert "had to beat ±8.1%, promotions at a family error rate of 0.01" in head
    assert main(["status", str(folder), "--json"]) == 0
    import json

    assert json.loads(capsys.readouterr().out)["incumbent_objective"] == 123.456


def test_a_lever_value_reads_the_same_in_the_report_status_and_export(night):
    """One codec (arms/values.py): each arm's change as export, status and the report show it."""
    from arms import values
    from tuner.morning.export import arms_frame
    from tuner.morning.status import status_data

    recs = records(night)
    frame = arms_frame(recs).set_index("arm")
    status = {a["arm"]: a for a in status_data(night)["arm_list"]}
    arms = section(write_report(night), "Arms")
    changed = [r for r in recs if r["op"] == "arm_start" and r.get("change")]
    assert changed
    for r in changed:
        lever, text = r["change"][0], values.text_of(r["change"][1])
        assert frame.at[r["arm"], "change_value"] == text
        assert status[r["arm"]]["change"] == f"{lever} → {text}"
        if r["arm"] in finished(recs):
            assert text in row_of(arms, r["arm"])


# -- the answer at the top (issue 20, item 7) ---------------------------------------------------------
@pytest.fixture(scope="module")
def undecided_night(tmp_path_factory):
    """A shorter night of the same campaign, one that ends with a change still undecided at its last
    incumbent (the 56-arm night decides every one)."""
    folder = simulated_night(tmp_path_factory.mktemp("night40"), arms=40)
    return folder, write_report(folder)


def test_the_answer_comes_first_with_its_interval_error_rate_and_what_is_undecided(undecided_night):
    night, report_md = undecided_night
    recs = records(night)
    assert report_md.index("## Headline") < report_md.index("## How sure") < report_md.index("## Arms")
    head = section(report_md, "Headline")
    paras = [p.strip() for p in head.split("\n\n") if p.strip()]
    assert paras[0].startswith("**Recommendation: the production shape with the change(s) below** — decode_geomean **+")
    final = Shape.from_dict([r for r in recs if r["op"] == "incumbent"][-1]["shape"])
    for change in Shape.from_dict(recs[0]["baseline"]).diff(final):          # the change list right under it
        assert f"- {_words(change)}" in paras[1]
    moves = [r for r in recs if r["op"] == "incumbent" and r.get("comparison")]
    c = moves[-1]["comparison"]
    for m in moves[-3:]:
        c = m["comparison"]
        assert f"arm #{m['arm']} {c['effect']:+.1%} [{c['lo']:+.1%}, {c['hi']:+.1%}] at error rate {c['alpha']:.2g}" in paras[0]
    assert paras[0].endswith(f"; promotions at a family error rate of {records(night)[-1]['error_rate']:g}.")
    inc = final.key()
    last = {}
    for r in recs:
        if r["op"] == "compare" and r.get("change") and r["incumbent"] == inc:
            last[(r["change"][0], json.dumps(r["change"][1]))] = r["comparison"]
    und = [c for c in last.values() if c["verdict"] == "undecided"]
    assert und, "the simulated night leaves a change undecided"
    still = next(p for p in paras if p.startswith("**Still undecided**"))
    assert paras.index(still) == 2 and f"({len(und)}, never promoted" in still
    for c in und[:4]:
        assert f"[{c['lo']:+.1%}, {c['hi']:+.1%}]" in still
    assert head.index("**Still undecided**") < head.index("Campaign **report-night**")


def test_undecided_arms_are_their_own_group_not_parity(night, report_md):
    arms = section(report_md, "Arms")
    moved = arms.split("### Incumbent moves (", 1)[1].split("\n### ", 1)[0]
    undecided = [n for n, e in finished(records(night)).items() if e["verdict"] == "undecided" and f"| #{n} " not in moved]
    assert undecided
    group = arms.split("### Undecided — not settled (", 1)[1].split("\n### ", 1)[0]
    parity = arms.split("### Parity — ruled out (", 1)[1].split("\n### ", 1)[0] if "### Parity" in arms else ""
    for n in undecided:
        assert f"| #{n} " in group and f"| #{n} " not in parity
        assert "undecided " in row_of(group, n) and "straddles 0" in row_of(group, n)
    assert "undecided" not in parity


def test_the_production_shape_is_named_only_when_the_campaign_has_one(night, tmp_path):
    folder = tmp_path / "night"
    shutil.copytree(night, folder)
    recs = records(folder)
    assert "production" in recs[0]["campaign"]
    assert "**Incumbent at start:** the production shape" in section(render_markdown(build_report(folder)), "Headline")
    del recs[0]["campaign"]["production"]
    write_journal(folder, recs)
    md = render_markdown(build_report(folder))
    assert "production shape" not in md
    head = section(md, "Headline")
    assert "**Incumbent at start:** the campaign's baseline (`" in head
    assert "**Recommendation: the campaign's baseline with the change(s) below**" in head
    assert "| #0 baseline (starting shape) |" in section(md, "Arms")


def test_simulated_time_is_said_as_such_and_how_the_report_knows(night, tmp_path):
    head = section(render_markdown(build_report(night)), "Headline")
    assert "of simulated time (a simulated night" in head and "of wall time" not in head
    inferred = "inferred: arm #0's host probes say “not scanned (simulated host)”"
    assert ("journaled in campaign_start" if "simulated" in records(night)[0] else inferred) in head
    folder = tmp_path / "night"
    shutil.copytree(night, folder)
    recs = records(folder)
    recs[0].pop("simulated", None)                           # a journal from before it was journaled
    write_journal(folder, recs)
    assert inferred in section(render_markdown(build_report(folder)), "Headline")
    for flag, words in ((True, "of simulated time"), (False, "of wall time")):
        recs[0]["simulated"] = flag                          # the loop journals it (branch `deadline`)
        write_journal(folder, recs)
        head = section(render_markdown(build_report(folder)), "Headline")
        assert words in head and "journaled in campaign_start" in head
    del recs[0]["simulated"]
    for r in recs:                                           # no probe evidence, a real engine, a real clock
        if r["op"] == "arm_end":
            r.pop("probes", None)
    recs[0]["campaign"]["engine"] = "vllm"
    for r in recs:
        r["t"] = r["t"] + 0.123
    write_journal(folder, recs)
    head = section(render_markdown(build_report(folder)), "Headline")
    assert "of wall time (a real host's clock)" in head and "simulated" not in head


def test_a_night_that_learned_nothing_says_so_first(night, tmp_path):
    folder = tmp_path / "night"
    shutil.copytree(night, folder)
    recs = records(folder)
    end = next(r for r in reversed(recs) if r["op"] == "campaign_end")
    end["no_result"] = {"cause": "the starting shape did not boot (2 of 2 boots failed: bad-argument)",
                        "evidence": "error: invalid argument: --mlock"}
    write_journal(folder, recs)
    md = render_markdown(build_report(folder))
    assert md.startswith("# Morning report: report-night — no result\n")
    head = section(md, "Headline")
    assert head.lstrip().startswith("**No result:** the starting shape did not boot (2 of 2 boots failed: "
                                    "bad-argument) — evidence: `error: invalid argument: --mlock`.")


def test_plots_are_wide_with_legible_text_and_legends_that_tell_arms_apart(night):
    import struct

    from matplotlib.text import Text

    from tuner.morning.report_plots import FIGURES, MIN_TEXT_PX

    rep = build_report(night)
    for name, png in rep.pngs().items():
        width, height = struct.unpack(">II", png[16:24])
        assert width >= 1600, (name, width)
    for name, draw in FIGURES.items():
        fig = draw(rep.plots)
        texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
        assert texts
        small = [(t.get_text(), t.get_fontsize() * fig.dpi / 72) for t in texts if t.get_fontsize() * fig.dpi / 72 < MIN_TEXT_PX]
        assert not small, (name, small)
        if name == "decode_vs_depth":
            labels = [t.get_text() for t in fig.legends[0].get_texts()]
            arms = [re.search(r"#(\d+) ", x) for x in labels]
            assert all(arms), labels                          # each entry names its arm
            assert len(set(labels)) == len(labels)
            bare = [re.sub(r"^.*?#\d+ (confirm )?", "", x) for x in labels]
            changed = [x for x in bare if "→" in x]
            assert changed and all(len(x) < 60 for x in changed), changed
    # the night's JSON-valued lever: its values are told apart by the keys in which they differ
    spec = [x for x in rep.frame["legend"] if "speculative-config → {" in x]
    assert spec and all("…" not in x or x.count("{…") == 1 for x in spec)
    by_value = {}
    for row in rep.frame.itertuples():
        if row.change_lever == "speculative-config":
            by_value.setdefault(row.change_value, set()).add(row.legend.split(" ", 1)[1].removeprefix("confirm "))
    names = [next(iter(v)) for v in by_value.values()]
    assert all(len(v) == 1 for v in by_value.values()) and len(set(names)) == len(names), by_value


# -- the committed example report is current ------------------------------------------------------------
def _example():
    import importlib.util

    from report_journals import REPO

    spec = importlib.util.spec_from_file_location("example_report", REPO / "scripts" / "example_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def utc(monkeypatch):
    import time

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_the_committed_example_report_is_what_its_journal_renders_today(tmp_path, utc):
    ex = _example()
    folder = tmp_path / "sim-demo"
    folder.mkdir()
    shutil.copy(ex.OUT / "journal.jsonl", folder / "journal.jsonl")
    committed = (ex.OUT / "REPORT.md").read_text()
    for log in ex.linked_logs(committed):
        (folder / log).parent.mkdir(parents=True)
        shutil.copy(ex.OUT / log, folder / log)
    md = render_markdown(build_report(folder))
    assert ex.body(committed) == md, "docs/example-report/REPORT.md is stale: run `bash scripts/example-report.sh`"
    assert committed.endswith(ex.trailer())
    for name in ("decode_vs_depth", "objective", "timeline"):
        assert f"](report/{name}.png)" in md and (ex.OUT / "report" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert (ex.OUT / "first-screen.png").read_bytes()[:4] == b"\x89PNG"


def test_the_committed_example_journal_is_what_the_night_writes_today(tmp_path, utc):
    ex = _example()
    folder = ex.run_night(tmp_path / "example")
    fresh = ex.normalized(folder / "journal.jsonl", tmp_path / "example")
    committed = ex.normalized(ex.OUT / "journal.jsonl", ex.ROOT)
    assert [r["op"] for r in fresh] == [r["op"] for r in committed]
    assert fresh == committed, "docs/example-report/journal.jsonl is stale: run `bash scripts/example-report.sh`"


def test_measure_membw_gbs_is_a_campaign_key_the_roofline_reads(tmp_path):
    """The README documents `measure.membw_gbs` (the roofline's bandwidth): the schema takes it."""
    import yaml

    from arms.errors import ConfigError
    from report_journals import REPO
    from tuner.morning.report_roofline import _bandwidth
    from tuner.night.campaign import load_campaign

    camp = yaml.safe_load((REPO / "examples" / "llamacpp-cpu.yaml").read_text())
    camp.setdefault("measure", {})["membw_gbs"] = 21.5
    camp["journal"] = str(tmp_path / "journal")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(camp, sort_keys=False))
    assert load_campaign(path).raw["measure"]["membw_gbs"] == 21.5
    assert _bandwidth(tmp_path, {"measure": {"membw_gbs": 21.5}}) == (21.5, "campaign measure.membw_gbs")
    camp["measure"]["membw_gbs"] = -3
    path.write_text(yaml.safe_dump(camp, sort_keys=False))
    with pytest.raises(ConfigError, match=r"measure\.membw_gbs"):
        load_campaign(path)


def test_a_night_in_which_nothing_booted_reads_no_result_from_its_arms(tmp_path):
    """examples/llamacpp-cpu.yaml --simulated: the simulated host runs the simulated engine, which
    refuses llama-server's argv, so every arm fails to boot; the report says so first, even on a
    journal with no journaled no_result."""
    import yaml

    from report_journals import REPO

    camp = yaml.safe_load((REPO / "examples" / "llamacpp-cpu.yaml").read_text())
    camp["journal"] = str(tmp_path / "journal")
    camp["budget"] = {"max_arms": 4}
    path = tmp_path / "llamacpp-cpu.yaml"
    path.write_text(yaml.safe_dump(camp, sort_keys=False))
    main(["run", str(path), "--simulated", "--quiet"])
    folder = tmp_path / "journal" / camp["name"]
    recs = records(folder)
    assert all(e["verdict"].startswith("boot-failed:") for e in finished(recs).values())
    first = next(e for e in finished(recs).values() if e["kind"] in ("baseline", "recheck"))
    end = next(r for r in reversed(recs) if r["op"] == "campaign_end")
    journaled = end.get("no_result")                  # the loop journals it (branch `deadline`); else read from the arms
    for nr in ([journaled] if journaled else []) + [None]:
        if nr is None and journaled:
            end.pop("no_result")
            write_journal(folder, recs)
        md = render_markdown(build_report(folder))
        assert md.startswith(f"# Morning report: {camp['name']} — no result\n")
        head = section(md, "Headline").lstrip()
        cause = nr["cause"] if nr else "no boot of the starting shape yielded the objective decode_geomean"
        assert head.startswith(f"**No result:** {cause}")
        assert f"evidence: `{first['boot']['evidence'][0]}`" in head.split("\n\n")[0]
        assert "**Recommendation: keep the campaign's baseline as it is** — the night measured nothing" in head
        assert "of simulated time" in head and "no objective measured" in head


def test_the_roofline_reads_the_bandwidth_the_night_journaled_and_never_probes_or_writes(tmp_path):
    """A reader never writes (issue 21): the night measures the host's memory bandwidth at its start
    and journals it in campaign_start; the report reads that, or an older folder's membw.json."""
    from tuner.morning.report_roofline import _bandwidth

    start = {"membw": {"gbs": 12.5, "source": "host.membw probe at the start of the night"}}
    assert _bandwidth(tmp_path, {}, start) == (12.5, "host.membw probe at the start of the night")
    assert _bandwidth(tmp_path, {"measure": {"membw_gbs": 30}}, start) == (30.0, "campaign measure.membw_gbs")
    gbs, source = _bandwidth(tmp_path, {}, {"op": "campaign_start"})
    assert gbs is None and source.startswith("not measured")
    assert list(tmp_path.iterdir()) == []                       # nothing probed, nothing written
    (tmp_path / "membw.json").write_text('{"gbs": 9.0, "source": "an older report"}')
    assert _bandwidth(tmp_path, {}, {}) == (9.0, "an older report")


def test_a_llamacpp_night_journals_its_bandwidth_at_the_start_and_a_simulated_one_does_not(tmp_path):
    from types import SimpleNamespace

    from tuner.daemon import _night_facts

    llama, vllm = SimpleNamespace(family="llamacpp"), SimpleNamespace(family="vllm")
    facts = _night_facts(SimpleNamespace(membw_gbs=None), llama)
    assert facts["membw"]["gbs"] > 0 and "start of the night" in facts["membw"]["source"]
    assert _night_facts(SimpleNamespace(membw_gbs=25.0), llama) == {}      # the campaign gives it
    assert _night_facts(SimpleNamespace(membw_gbs=None), vllm) == {}


# -- a block's drift, said in what an operator can use ------------------------------------------------------
def _block_frame(times: dict[int, float]):
    from types import SimpleNamespace

    arms = {n: SimpleNamespace(end={"t": 1000.0 + t}) for n, t in times.items()}
    return SimpleNamespace(arms=arms, st=SimpleNamespace(started={"t": 1000.0}))


@pytest.mark.parametrize("times,refs,per_h,want", [
    # a real 2-core night: incumbent boots 3 minutes apart, +5 % between them -> "+4000 %/h" said as the move
    ({1: 60, 2: 150, 3: 240}, [1, 3], math.expm1(math.log1p(0.05) / (180 / 3600)),
     "the incumbent moved +5.0% across it (3 min)"),
    ({1: 0, 2: 1800, 3: 7200}, [1, 3], 0.02, "incumbent drift across it +2.0%/h"),     # two hours: per hour
    ({1: 60, 2: 150, 3: 240}, [1, 3], -0.5, "the incumbent moved -3.4% across it (3 min)"),
    # two incumbent boots each side: the step the block saw is between the two right around the challenger's
    ({0: 0, 1: 60, 2: 150, 4: 240, 6: 900}, [0, 1, 4, 6], math.expm1(math.log1p(0.05) / (180 / 3600)),
     "the incumbent moved +5.0% across it (3 min)"),
])
def test_a_blocks_drift_is_the_move_across_it_when_it_spans_minutes(times, refs, per_h, want):
    from tuner.morning.report_blocks import block_lines

    line, = block_lines(_block_frame(times), {"blocks": [{"boot": 2, "ref": refs, "w": [1 / len(refs)] * len(refs),
                                                          "diff": 0.8, "closed": True, "drift_per_h": per_h}]})
    assert line.endswith(want), line


@pytest.mark.parametrize("name", ["docs/example-report-llamacpp", "docs/example-report-vllm",
                                  "docs/example-report-vllm-goodput"])
def test_a_real_nights_committed_report_is_what_its_journal_renders_today(name, tmp_path, utc):
    """A real night (llama-server, vLLM) cannot be run again the same, but its report is a pure function
    of the journal committed beside it: `python scripts/rerender_examples.py` writes it anew."""
    import importlib.util

    from report_journals import REPO

    spec = importlib.util.spec_from_file_location("rerender_examples", REPO / "scripts" / "rerender_examples.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    folder = REPO / name
    committed, trailer = mod.split((folder / "REPORT.md").read_text())
    assert trailer.startswith(mod.TRAILER), "the trailer that says how the night was run is missing"
    mod.models()
    md = render_markdown(build_report(mod.staged(folder, tmp_path)))
    assert committed == md, f"{name}/REPORT.md is stale: run `.venv/bin/python scripts/rerender_examples.py`"
    if name.endswith("goodput"):      # the knee and the goodput at the SLO, per swept arm
        table = md.split("## Concurrency sweep", 1)[1].split("\n## ", 1)[0]
        assert "| Arm | goodput at SLO | knee | concurrency 1 |" in table and table.count("meets the SLO") >= 4
