"""`tuner check` refuses every input that would waste a night or break on a path, before anything
starts and without podman (CONTAINER_HOST names a socket that does not exist): exit 2, one
`FILE:LINE: KEY: ...` line, at the line that holds the error (marked `#!` in each case).

A valid file is not at fault when podman does not answer: exit 4 (`tuner.cli.EXIT_NOT_PINNED`),
and `--offline` validates without asking. Read-only file systems are made in a private mount
namespace (`unshare -m`, as root); "not writable by this user" runs the CLI as `nobody` through
`setpriv` (root writes anywhere). Each is skipped where the tool is missing."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO
from tuner import cli

NO_PODMAN = {"CONTAINER_HOST": "unix:///nonexistent/podman.sock"}


def head(args: str = "{max-num-seqs: 4}", extra: str = "") -> str:
    return f"""\
name: table
engine: vllm-expert-offload
baseline:
  image: localhost/offload-tuner-simengine:latest
  model: /models/sim
  args: {args}
  env: {{R4D_LRU_GATHER_CHUNKS: 8}}
{extra}"""


LEVERS = "levers:\n  max-num-seqs: [2, 8]\n"


def baseline_with(line: str) -> str:
    """HEAD with one more baseline line (marked) and a lever."""
    return head(extra=line) + LEVERS


def bomb() -> str:
    rows = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for x, y in zip("bcdefghi", "abcdefgh"):
        rows.append(f"{x}: &{x} [" + ",".join([f"*{y}"] * 9) + "]" + ("  #!" if x == "e" else ""))
    return head() + LEVERS + "\n".join(rows) + "\n"


# (id, campaign text (or a function of the test's folder), the key, a part of the message)
CASES = [
    # objectives, depths, levers: what a night would learn nothing from
    ("objective-depth-not-measured", head() + LEVERS + "objective: decode@4064  #!\nmeasure:\n  depths: [166, 1087]\n",
     "objective", "decode@4064 reads depth 4064, which the night does not measure"),
    ("objective-depth-not-default", head() + LEVERS + "objective: decode@512  #!\n", "objective",
     "measure.depths: [166, 1087, 4064]"),
    ("levers-empty", head() + "levers: {}  #!\n", "levers", "a night with nothing to try"),
    ("levers-null", head() + "levers:  #!\n", "levers", "should be a valid dictionary, got None"),
    ("one-value-is-the-baseline", head() + "levers:\n  max-num-seqs: [4]  #!\n", "levers.max-num-seqs",
     "its only value 4 is the baseline's"),
    ("absent-is-the-baseline", head() + "levers:\n  expert-prefetch: [absent]  #!\n", "levers.expert-prefetch",
     "its only value absent is the baseline's"),
    ("env-lever-is-the-baseline", head() + "levers:\n  env.R4D_LRU_GATHER_CHUNKS: ['8']  #!\n",
     "levers.env.R4D_LRU_GATHER_CHUNKS", "is the baseline's"),
    ("two-values-one-engine", head() + "levers:\n  max-num-seqs: [8, '8']  #!\n", "levers.max-num-seqs",
     "values 8 and 8 run the engine the same way (--max-num-seqs 8"),
    ("lever-on-the-port", head() + "levers:\n  port: [8001, 8002]  #!\n", "levers.port", "the tuner owns 'port'"),
    ("lever-on-the-host", head() + "levers:\n  --host: [0.0.0.0, 127.0.0.2]  #!\n", "levers.--host",
     "the tuner owns 'host'"),
    ("lever-on-the-model", head() + "levers:\n  model: [/models/a, /models/b]  #!\n", "levers.model",
     "the tuner owns 'model'"),
    ("depth-twice", head() + LEVERS + "measure:\n  depths:\n  - 166\n  - 1087\n  - 166  #!\n", "measure.depths.2",
     "166 is given twice"),
    ("sweep-level-twice", head() + LEVERS + "measure:\n  sweep:\n    levels: [1, 2, 2]  #!\n",
     "measure.sweep.levels.2", "2 is given twice"),
    # the baseline: what every arm would fail on
    ("digest-too-short", head().replace("simengine:latest", "simengine@sha256:abc  #!") + LEVERS, "baseline.image",
     "digest 'sha256:abc' is not sha256: and 64 hex digits (got 3 characters)"),
    ("digest-not-sha256", head().replace("simengine:latest", "simengine@md5:" + "0" * 32 + "  #!") + LEVERS,
     "baseline.image", "is not sha256: and 64 hex digits"),
    ("baseline-arg-port", head(args="\n    max-num-seqs: 4\n    port: 9000  #!") + LEVERS, "baseline.args.port",
     "set baseline.port instead"),
    ("baseline-arg-unknown", head(args="\n    max-num-seq: 4  #!") + LEVERS, "baseline.args.max-num-seq",
     "did you mean 'max-num-seqs'?"),
    ("env-name-with-equals", head().replace("  env: {R4D_LRU_GATHER_CHUNKS: 8}\n",
                                            "  env:\n    R4D_LRU_GATHER_CHUNKS: 8\n    A=B: 1  #!\n") + LEVERS,
     "baseline.env.A=B", "write A: 'B'"),
    ("env-name-with-space", head().replace("  env: {R4D_LRU_GATHER_CHUNKS: 8}\n",
                                           "  env:\n    R4D_LRU_GATHER_CHUNKS: 8\n    'MY VAR': 1  #!\n") + LEVERS,
     'baseline.env."MY VAR"', "is not an env var name"),
    ("env-name-empty", head().replace("  env: {R4D_LRU_GATHER_CHUNKS: 8}\n",
                                      "  env:\n    R4D_LRU_GATHER_CHUNKS: 8\n    '': 1  #!\n") + LEVERS,
     'baseline.env.""', "is not an env var name"),
    ("mount-without-colon", baseline_with("  mounts:\n  - /srv/data  #!\n"), "baseline.mounts.0",
     "write SOURCE:TARGET[:ro]"),
    ("mount-target-twice", lambda d: baseline_with(f"  mounts:\n  - {d}:/data:ro\n  - {d}:/data  #!\n"),
     "baseline.mounts.1", "target /data is mounted twice"),
    ("option-unknown", baseline_with("  options:\n    name: my-container  #!\n"), "baseline.options.name",
     "not a container option the tuner passes on"),
    # paths no file can be written to, or that do not exist
    ("compile-cache-under-proc", baseline_with("  compile_cache: /proc/tuner-cache  #!\n"), "baseline.compile_cache",
     "/proc cannot hold files"),
    ("compile-cache-under-a-file", lambda d: baseline_with(f"  compile_cache: {d}/a-file/cache  #!\n"),
     "baseline.compile_cache", "a-file, which is a file, not a folder"),
    ("compile-cache-relative-target", baseline_with("  compile_cache: {source: ./cc, target: cache}  #!\n"),
     "baseline.compile_cache", "an absolute target"),
    ("journal-under-proc", head() + LEVERS + "journal: /proc/journal  #!\n", "journal", "/proc cannot hold files"),
    ("journal-under-sys", head() + LEVERS + "journal: /sys/kernel/journal  #!\n", "journal", "cannot hold files"),
    ("journal-under-a-file", lambda d: head() + LEVERS + f"journal: {d}/a-file/journal  #!\n", "journal",
     "which is a file, not a folder"),
    ("journal-name-too-long", head() + LEVERS + "journal: ./" + "j" * 300 + "  #!\n", "journal",
     "a file name holds at most 255"),
    ("journal-nul-byte", head() + LEVERS + 'journal: "./jour\\0nal"  #!\n', "journal", "holds a NUL byte"),
    ("mount-source-missing", baseline_with("  mounts:\n  - /no/such/dir:/data:ro  #!\n"), "baseline.mounts.0",
     "mount source /no/such/dir (-> /data) does not exist on this host"),
    ("device-missing", baseline_with("  devices:\n  - /dev/null\n  - /dev/no-such-gpu  #!\n"), "baseline.devices.1",
     "device /dev/no-such-gpu does not exist on this host"),
    ("llamacpp-model-missing", "name: table\nengine: llamacpp\nbaseline:\n  image: localhost/x:1\n"
                               "  model: /models/not-here.gguf  #!\n  args: {threads: 1}\nlevers:\n  threads: [1, 2]\n",
     "baseline.model", "model /models/not-here.gguf does not exist on this host"),
    ("vllm-model-folder-not-a-model",
     lambda d: f"name: table\nengine: vllm\nbaseline:\n  image: localhost/x:1\n  model: /models/tiny  #!\n"
               f"  mounts: ['{d}:/models/tiny:ro']\nlevers:\n  max-num-seqs: [2, 8]\n",
     "baseline.model", "is a folder without config.json"),
    ("llamacpp-flag-word", "name: table\nengine: llamacpp\nbaseline:\n  image: localhost/x:1\n  model: /models/q.gguf\n"
                           "  args:\n    threads: 1\n    fa: 'yes'  #!\nlevers:\n  threads: [1, 2]\n",
     "baseline.args.fa", "-fa takes on, off, auto"),
    ("llamacpp-lever-word", "name: table\nengine: llamacpp\nbaseline:\n  image: localhost/x:1\n  model: /models/q.gguf\n"
                            "  args: {threads: 1}\nlevers:\n  fit: [on, maybe]  #!\n", "levers.fit", "-fit takes on, off"),
    # files a parser should not have to swallow
    ("alias-bomb", bomb(), "e", "aliases expand to more than 20,000 values"),
    ("nested-5000-deep", head(args="\n    max-num-seqs: 4\n    speculative-config: " + "[" * 5000 + "]" * 5000 + "  #!")
     + LEVERS, "baseline.args.speculative-config", "nested more than 32 levels deep"),
    ("not-utf8", (head().replace("  env: {R4D_LRU_GATHER_CHUNKS: 8}\n", "  env:\n    GREETING: caf\xe9  #!\n")
                  + LEVERS).encode("latin-1"), "baseline.env.GREETING", "byte 0xe9 at column 18 is not UTF-8"),
    ("over-1-MB", head() + LEVERS + "description: '" + "x" * 1_100_000 + "'\n", "(file)",
     "over the 1,000,000-byte limit of a campaign file"),
]


def _marked(text: str | bytes) -> list[int]:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    lines = [i for i, ln in enumerate(text.splitlines(), 1) if ln.rstrip().endswith("#!")]
    return lines or [1]


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "data").mkdir()
    return tmp_path


@pytest.mark.parametrize("name,text,key,why", CASES, ids=[c[0] for c in CASES])
def test_refused_before_anything_starts_without_podman(folder, capsys, monkeypatch, name, text, key, why):
    monkeypatch.setenv("CONTAINER_HOST", NO_PODMAN["CONTAINER_HOST"])
    text = text(folder / "data" if "mount" in name else folder) if callable(text) else text
    path = folder / f"{name}.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    rc = cli.main(["check", str(path)])
    err = capsys.readouterr().err
    assert rc == 2, err
    errors = err.strip().splitlines()
    assert len(errors) == 1, err                        # one error, one line: nothing else on stderr
    (line,) = _marked(text)
    assert errors[0].startswith(f"tuner: error: {path}:{line}: {key}: "), err
    assert why in errors[0], err
    assert "Traceback" not in err and "does not answer" not in err
    assert not (folder / "journal").exists() and not (folder / "cc").exists()   # nothing created


def test_the_table_has_at_least_25_inputs():
    assert len(CASES) >= 25 and len({c[0] for c in CASES}) == len(CASES)


def test_several_errors_each_at_its_own_line(folder, capsys, monkeypatch):
    monkeypatch.setenv("CONTAINER_HOST", NO_PODMAN["CONTAINER_HOST"])
    text = head().replace("  env: {R4D_LRU_GATHER_CHUNKS: 8}\n",
                          "  env:\n    A=B: 1  #!\n    MY VAR: 2  #!\n  mounts:\n  - /srv  #!\n") \
        + "levers:\n  port: [1, 2]  #!\n  max-num-seqs: [4]  #!\nobjective: decode@7  #!\n"
    path = folder / "many.yaml"
    path.write_text(text)
    assert cli.main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    got = sorted(int(e.split(f"{path}:")[1].split(":")[0]) for e in err)
    # the lever equal to the baseline is found after the file validates: the others first
    assert got == [ln for ln in _marked(text) if ln != 14], err


# -- validation without podman ---------------------------------------------------------------
def tuner(*args, env=None, user=None, timeout=120) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "tuner.cli", *args]
    if user:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **NO_PODMAN, "HOME": "/tmp", **(env or {})})


def test_a_valid_campaign_without_podman_is_not_bad_input(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(head() + LEVERS + f"journal: {tmp_path}/journal\n")
    r = tuner("check", str(path))
    assert r.returncode == cli.EXIT_NOT_PINNED == 4, r.stderr
    assert r.stderr.count("\n") == 1 and "valid, but its image is not pinned to a digest" in r.stderr
    assert "/nonexistent/podman.sock does not answer" in r.stderr and "tuner: error" not in r.stderr
    assert "campaign table: 1 levers" in r.stdout and "-> not pinned" in r.stdout and "max-num-seqs -> 2" in r.stdout
    off = tuner("check", str(path), "--offline", "--json")
    assert off.returncode == 0 and off.stderr == "", off.stderr
    assert '"valid": true' in off.stdout and '"pinned": false' in off.stdout
    bad = tuner("check", str(path.with_name("missing.yaml")))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_run_refuses_a_path_before_the_night_starts(tmp_path):
    (tmp_path / "a-file").write_text("")
    path = tmp_path / "run.yaml"
    path.write_text(head() + LEVERS + f"journal: {tmp_path}/a-file/journal\n")
    r = tuner("run", str(path), "--simulated", "--quiet")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and f"{path}:10: journal: " in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "run.yaml"]    # no folder, no arm opened


def test_a_night_checks_its_host_paths_at_their_lines(tmp_path):
    """`tuner run` (tuner/daemon.py) calls check_paths(baseline, camp) before the first boot."""
    from tuner.night.campaign import check_paths, load_campaign
    from tuner.night.schema import CampaignInvalid

    path = tmp_path / "c.yaml"
    path.write_text(baseline_with("  compile_cache: /proc/tuner-cache  #!\n  mounts: [/no/such:/data]  #!\n"
                                  "  devices: [/dev/no-such-gpu]  #!\n"))
    camp = load_campaign(path)
    with pytest.raises(CampaignInvalid) as e:
        check_paths(camp.baseline, camp)
    assert [int(x.split(":")[1]) for x in e.value.errors] == _marked(path.read_text())
    assert [x.split(": ")[1] for x in e.value.errors] == ["baseline.compile_cache", "baseline.mounts.0",
                                                          "baseline.devices.0"]


# -- read-only file systems and a user who cannot write ---------------------------------------
def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_unshare(), reason="needs unshare -m (root in a private mount namespace)")
@pytest.mark.parametrize("what", ["journal", "compile_cache", "export"])
def test_a_read_only_file_system_is_one_line(tmp_path, what):
    ro = tmp_path / "ro"
    ro.mkdir()
    path = tmp_path / "c.yaml"
    extra = f"  compile_cache: {ro}/cache\n" if what == "compile_cache" else ""
    path.write_text(baseline_with(extra) + f"journal: {ro if what == 'journal' else tmp_path}/journal\n")
    command = (f"{sys.executable} -m tuner.cli export {tmp_path} -o {ro}/arms.csv" if what == "export"
               else f"{sys.executable} -m tuner.cli check {path}")
    r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro none {ro} && exec {command}"],
                       cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, **NO_PODMAN})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "is on a read-only file system" in lines[0], r.stderr
    if what == "export":
        assert lines[0].startswith(f"tuner: error: -o {ro}/arms.csv: ")
    else:
        key = "journal" if what == "journal" else "baseline.compile_cache"
        line = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if ln.startswith(f"{key.split('.')[-1]}:")
                    or ln.startswith(f"  {key.split('.')[-1]}:"))
        assert lines[0].startswith(f"tuner: error: {path}:{line}: {key}: "), r.stderr


def _nobody_can_run() -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    try:
        return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                               "-c", "import tuner.cli"], cwd=REPO, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _nobody_can_run(), reason="needs root, setpriv and a checkout nobody can read")
def test_folders_this_user_cannot_write(tmp_path):
    top = Path(tempfile.mkdtemp(prefix="tuner-nobody-"))       # pytest's own tmp folder is root's only
    try:
        top.chmod(0o777)                                        # nobody may write here, not in root-only
        (top / "root-only").mkdir(mode=0o755)                    # root's, not writable by nobody
        for key, extra, journal in (("baseline.compile_cache", f"  compile_cache: {top}/root-only/cache\n", top),
                                    ("journal", "", f"{top}/root-only/j")):
            path = top / "c.yaml"
            path.write_text(baseline_with(extra) + f"journal: {journal}\n")
            path.chmod(0o644)
            r = tuner("check", str(path), user=65534)
            assert r.returncode == 2, r.stderr
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].split(": ")[3] == key, r.stderr
            assert "root-only is not writable by this user (nobody)" in lines[0], r.stderr
    finally:
        shutil.rmtree(top)


# -- export -o --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def night(tmp_path_factory):
    from report_journals import simulated_night

    return simulated_night(tmp_path_factory.mktemp("export-night"), arms=4)


@pytest.mark.parametrize("target,why", [
    ("/proc/arms.csv", "/proc cannot hold files"),
    ("{d}/a-file/arms.csv", "a-file is a file, not a folder"),
    ("{d}", "is a folder; give a file name"),
    ("/sys/arms/arms.csv", "cannot hold files"),
])
def test_export_onto_a_path_no_file_can_be_written_to(night, folder, capsys, target, why):
    target = target.format(d=folder)
    assert cli.main(["export", str(night), "-o", target]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tuner: error: -o {target}: ") and why in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("holds", ["config.json", "params.json"])
def test_a_vllm_model_folder_that_holds_a_model_config_passes(tmp_path, capsys, holds):
    """The other side of ``vllm-model-folder-not-a-model``: a Hugging Face folder (config.json) or a
    Mistral-format one (params.json) is a model folder."""
    model = tmp_path / "tiny"
    model.mkdir()
    (model / holds).write_text("{}")
    path = tmp_path / "ok.yaml"
    path.write_text(f"name: table\nengine: vllm\nbaseline:\n  image: localhost/x:1\n  model: /models/tiny\n"
                    f"  mounts: ['{model}:/models/tiny:ro']\nlevers:\n  max-num-seqs: [2, 8]\n"
                    f"journal: {tmp_path}/journal\n")
    assert cli.main(["check", str(path), "--offline"]) == 0, capsys.readouterr().err
