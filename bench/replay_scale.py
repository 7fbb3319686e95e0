"""Replay and the loop's per-arm journal bookkeeping at 10,000 arms, before and after
incremental replay (issue 14).

before  what the loop did after every arm until issue 14: copy the journal's records
        (``Journal.records``) and replay all of them (``tuner.night.state.replay``) — linear in the arms
        so far, quadratic over a night;
after   ``tuner.night.state.Replay.follow(journal)``: fold in only the new arm's records.

Both are timed on the same journal (bench/report_scale.py's synthetic night, ~10 KB per arm
end) while arms are appended to it through the writer (``Journal.append``, fsync'd), and the two
states are checked equal. Also timed: a reader's whole read (``read_journal``: parse and
validate every line) and replay, and the writer's open at resume (``Journal``).

The loop's whole per-arm overhead (``--loop-only``, with ``--before-rev`` also that revision's): a real ``CampaignLoop`` (SimHost, the campaign's
Optuna journal study rebuilt from the synthetic night at resume) runs ``--new-arms`` more arms with
the arm itself stubbed (``ArmRunner.run`` returns a canned measured record at once, after asking
the loop's extender once, as a real boot does), so the time between two arms is everything the
loop does per arm besides the arm: the search policy, Optuna ask and tell, the journaled
judgement (State.judged, the noise band), the comparison's bookkeeping, the fsync'd appends and
the incremental replay. ``--profile`` prints cProfile's top functions over those arms at the
largest scale.

  .venv/bin/python bench/replay_scale.py --arms 1000 5000 10000 --out bench/results/replay_scale.md
  .venv/bin/python bench/replay_scale.py --loop-only --arms 1000 5000 10000 --before-rev 9620f11 [--profile]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from arms.shape import Shape  # noqa: E402
from report_scale import BASELINE, synthesize  # noqa: E402
from simbench import emit  # noqa: E402
from tuner.night.journal import Journal  # noqa: E402
from tuner.night.readback import read_journal  # noqa: E402
from tuner.night.state import Replay, replay  # noqa: E402


def timed(fn, repeat: int = 1):
    out, ts = None, []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return out, statistics.median(ts)


def same(a, b) -> bool:
    return (a.incumbent_key, a.incumbent_arm, a.samples, sorted(a.arms), [x.verdict for x in a.arms.values()]) == \
           (b.incumbent_key, b.incumbent_arm, b.samples, sorted(b.arms), [x.verdict for x in b.arms.values()])


OLD = """
import json, sys, time, statistics
sys.path.insert(0, sys.argv[1])
from arms.shape import Shape
from tuner.night.journal import Journal
from tuner.night.state import replay
j = Journal(sys.argv[2])
base = Shape.from_dict(json.loads(sys.argv[3]))
ts = []
for _ in range(int(sys.argv[4])):
    t0 = time.perf_counter()
    replay(j.records, base)
    ts.append(time.perf_counter() - t0)
print(statistics.median(ts))
"""


def snapshot(rev: str) -> Path:
    """The tree of ``rev`` (tuner/, arms/) in a temporary folder, to time its replay."""
    import subprocess

    dest = Path(tempfile.mkdtemp(prefix="replay-before-"))
    tar = subprocess.run(["git", "archive", rev, "tuner", "arms"], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    return dest


def old_replay_s(tree: Path, path: Path, repeat: int) -> float:
    import json
    import subprocess

    r = subprocess.run([sys.executable, "-c", OLD, str(tree), str(path), json.dumps(BASELINE), str(repeat)],
                       capture_output=True, text=True, check=True, cwd=tree)
    return float(r.stdout.strip().splitlines()[-1])


def one_scale(arms: int, new_arms: int, repeat: int, before_tree: Path | None = None) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="replay-scale-")) / "night"
    path = synthesize(folder, arms)
    baseline = Shape.from_dict(BASELINE)
    got, read_s = timed(lambda: read_journal(path), repeat)
    records = got.records
    _, full_s = timed(lambda: replay(records, baseline), repeat)
    j, open_s = timed(lambda: Journal(path), 1)
    follower = Replay(baseline)
    follower.follow(j)
    start = next(r for r in reversed(records) if r["op"] == "arm_start")
    end = next(r for r in reversed(records) if r["op"] == "arm_end")
    strip = ("op", "seq", "t")
    before, after, append = [], [], []
    for k in range(new_arms):
        n = arms + k
        t0 = time.perf_counter()
        j.append("arm_start", **{**{x: v for x, v in start.items() if x not in strip}, "arm": n, "trial": n})
        j.append("arm_end", **{**{x: v for x, v in end.items() if x not in strip}, "arm": n})
        j.append("told", arm=n, trial=n)
        append.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        old = replay(j.records, baseline)
        before.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        new = follower.follow(j)
        after.append(time.perf_counter() - t0)
        assert same(old, new), f"incremental replay disagrees with the full replay at arm {n}"
    main_s = old_replay_s(before_tree, path, repeat) if before_tree else None
    return {"arms": arms, "records": len(records), "mib": path.stat().st_size / 2**20, "read_s": read_s,
            "full_s": full_s, "open_s": open_s, "before_s": statistics.median(before),
            "after_s": statistics.median(after), "append_s": statistics.median(append), "main_s": main_s}


def _campaign_file(folder: Path) -> Path:
    """A campaign file whose baseline and levers are the synthetic night's (bench/report_scale.py)."""
    import yaml
    from arms.shape import ABSENT
    from report_scale import LEVERS

    def txt(v):
        return "absent" if v is ABSENT else v
    base = Shape.from_dict(BASELINE)
    path = folder.parent.parent / f"{folder.name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": folder.name, "engine": "simengine",
        "baseline": {"image": "localhost/offload-tuner-simengine:sim", "model": base.model,
                     "args": {k: v for k, v in BASELINE["args"]}, "env": dict(BASELINE["env"]), "port": 8000},
        "levers": {k: [txt(v) for v in vs] for k, vs in LEVERS.items()},
        "objective": "decode_geomean", "journal": str(folder.parent)}))
    return path


def loop_scale(arms: int, new_arms: int, profile: bool = False) -> dict:
    """The real loop's per-arm overhead after a night of ``arms`` arms (the arm itself stubbed)."""
    import copy
    import cProfile
    import io
    import pstats

    from arms.profiles import load_profile
    from host.simhost import SimHost
    from tuner.night.campaign import load_campaign
    from tuner.night.loop import CampaignLoop

    folder = Path(tempfile.mkdtemp(prefix="loop-scale-")) / "journal" / "night"
    path = synthesize(folder, arms)
    recs = read_journal(path).records
    template = next(r for r in reversed(recs) if r["op"] == "arm_end" and r.get("measurement")
                    and r.get("verdict") in ("worse", "parity"))
    camp, host = SimHost.pinned(load_campaign(_campaign_file(folder)), noise_seed=0)
    t0 = time.perf_counter()
    loop = CampaignLoop(camp, host, load_profile("simengine"), max_arms=arms + new_arms, force_resume=True)
    marks: list[float] = []

    def stub(n, shape, *, kind, extend=None, **kw):       # the arm itself: nothing
        rec = {k: copy.deepcopy(v) for k, v in template.items() if k not in ("op", "seq", "t", "arm")}
        rec.update(kind=kind, noise=0.01, delta=-0.05, threshold=0.02,
                   verdict="recheck" if kind in ("baseline", "recheck") else "worse")
        if extend is not None:
            extend(rec["measurement"])
        return rec
    loop.runner.run = stub
    loop.on_arm = lambda st, end: marks.append(time.perf_counter())
    start_s = None
    orig_start = loop._start

    def timed_start():
        nonlocal start_s
        st = orig_start()
        start_s = time.perf_counter() - t0
        if prof:
            prof.enable()
        marks.append(time.perf_counter())
        return st
    loop._start = timed_start
    prof = cProfile.Profile() if profile else None
    loop.run()
    if prof:
        prof.disable()
    per = [b - a for a, b in zip(marks, marks[1:])]
    top = None
    if prof:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
        top = out.getvalue()
    return {"arms": arms, "start_s": start_s, "loop_s": statistics.median(per), "loop_max_s": max(per),
            "n": len(per), "profile": top}


def loop_before(rev: str, arms: list[int], new_arms: int) -> list[dict]:
    """``loop_scale`` run on the tree of ``rev`` (this script copied into it)."""
    import json
    import shutil
    import subprocess

    dest = Path(tempfile.mkdtemp(prefix="loop-before-"))
    tar = subprocess.run(["git", "archive", rev], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    shutil.copy(Path(__file__), dest / "bench" / "replay_scale.py")
    r = subprocess.run([sys.executable, "bench/replay_scale.py", "--loop-only", "--json", "--new-arms", str(new_arms),
                        "--arms", *map(str, arms)], cwd=dest, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def loop_table(rows: list[dict], before: list[dict] | None, args) -> list[str]:
    cmd = (f".venv/bin/python bench/replay_scale.py --loop-only --arms {' '.join(map(str, args.arms))} "
           f"--new-arms {args.new_arms}" + (f" --before-rev {args.before_rev}" if before else "")
           + (f" --out {args.out}" if args.out else ""))
    lines = [f"command: {cmd}", "",
             f"the real CampaignLoop (SimHost) resumed on a synthetic night of that many arms (bench/report_scale.py), "
             f"the arm itself stubbed; per arm: the median wall time between two arms over up to {args.new_arms} arms "
             f"(fewer where the policy converged first: {', '.join(str(r['n']) for r in rows)} after"
             + (f", {', '.join(str(b['n']) for b in before)} before" if before else "") + ") "
             f"(search policy, Optuna ask/tell on the journal study, State.judged and the noise band, the comparison's "
             f"bookkeeping, 4 fsync'd appends, incremental replay); {os.cpu_count()} CPUs, Python "
             f"{platform.python_version()}.", "",
             "| arms | per arm: before" + (f" ({args.before_rev})" if before else "") + " | max | per arm: after "
             "| max | resume (replay + Optuna study rebuilt from the journal): before | after |",
             "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        b = before[i] if before else None
        bs = (f"{b['loop_s'] * 1e3:.1f} ms", f"{b['loop_max_s'] * 1e3:.1f} ms", f"{b['start_s']:.1f} s") if b else ("-",) * 3
        lines.append(f"| {r['arms']:,} | {bs[0]} | {bs[1]} | {r['loop_s'] * 1e3:.1f} ms | {r['loop_max_s'] * 1e3:.1f} ms "
                     f"| {bs[2]} | {r['start_s']:.1f} s |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arms", type=int, nargs="+", default=[1000, 5000, 10000])
    ap.add_argument("--new-arms", type=int, default=10, help="arms appended (and timed) at each scale")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before-rev", default=None, help="also time this git revision's replay per arm (the code before)")
    ap.add_argument("--out", help="also write the results as Markdown to this file")
    ap.add_argument("--loop-only", action="store_true", help="only the loop's per-arm overhead")
    ap.add_argument("--json", action="store_true", help="with --loop-only: print the rows as JSON")
    ap.add_argument("--profile", action="store_true", help="print cProfile's top functions of the loop's arms "
                                                            "at the largest scale")
    args = ap.parse_args()
    if args.loop_only:
        loops = [loop_scale(a, args.new_arms, args.profile and a == max(args.arms)) for a in args.arms]
        if args.json:
            import json
            print(json.dumps(loops))
            return 0
        before = loop_before(args.before_rev, args.arms, args.new_arms) if args.before_rev else None
        if args.out:
            emit(loop_table(loops, before, args), args.out)
        for r in loops:
            print(f"{r['arms']}: loop per arm {r['loop_s'] * 1e3:.1f} ms (max {r['loop_max_s'] * 1e3:.1f}, "
                  f"{r['n']} arms), resume {r['start_s']:.1f} s")
            if r["profile"]:
                print(r["profile"])
        return 0
    tree = snapshot(args.before_rev) if args.before_rev else None
    rows = [one_scale(a, args.new_arms, args.repeat, tree) for a in args.arms]
    cmd = (f".venv/bin/python bench/replay_scale.py --arms {' '.join(map(str, args.arms))} "
           f"--new-arms {args.new_arms} --repeat {args.repeat}" + (f" --before-rev {args.before_rev}" if tree else "")
           + (f" --out {args.out}" if args.out else ""))
    lines = [f"command: {cmd}", "",
             f"synthetic journals (bench/report_scale.py), {os.cpu_count()} CPUs, Python {platform.python_version()}; "
             f"per-arm figures are medians over {args.new_arms} arms appended at that scale, whole-journal figures "
             f"medians of {args.repeat} runs. Incremental and full replay were checked equal after every arm.", "",
             "| arms | journal | per arm: before, the loop at " + (args.before_rev or "-") + " (copy + full replay, "
             "its replay) | per arm: copy + full replay (this replay) | per arm: after (incremental) | speed-up vs "
             "the full replay | per arm: 3 fsync'd appends | reader: read + validate | reader: replay "
             "| writer open (resume) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        main = "-" if r["main_s"] is None else f"{r['main_s'] * 1e3:.1f} ms"
        lines.append(f"| {r['arms']:,} | {r['mib']:.1f} MiB, {r['records']:,} records | {main} "
                     f"| {r['before_s'] * 1e3:.1f} ms "
                     f"| {r['after_s'] * 1e3:.3f} ms | {r['before_s'] / max(r['after_s'], 1e-9):,.0f}x "
                     f"| {r['append_s'] * 1e3:.1f} ms | {r['read_s']:.2f} s | {r['full_s']:.2f} s | {r['open_s']:.2f} s |")
    last = rows[-1]
    per = last["main_s"] if last["main_s"] is not None else last["before_s"]
    lines += ["", f"Over a night of {last['arms']:,} arms the loop's replays cost about "
              f"{last['arms'] * per / 2 / 60:.0f} min before (the per-arm cost grows linearly, so the "
              f"night's total is quadratic: ~ arms x per-arm-at-the-end / 2) and "
              f"{last['arms'] * last['after_s']:.2f} s after."]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
