"""One value per argv: a llama.cpp campaign's flag values are canonical when it is loaded, so two
shapes are the same shape exactly when they render the same command line (arms.spellings).

The bug this pins: a baseline ``flash-attn: "on"`` and a lever value ``on`` (YAML 1.1: true) were
two shapes with one argv (``-fa on``), and the tuner measured one engine twice as two arms.
"""
from __future__ import annotations

import subprocess

import pytest

from arms.argv import render_argv
from arms.errors import ConfigError
from arms.shape import ABSENT, Lever, Shape
from arms.spellings import flag_table
from tests.conftest import REPO

LLAMA = flag_table("llamacpp")
IMAGE = "localhost/llama@sha256:" + "a" * 64


@pytest.mark.parametrize("name, values, canonical, argv", [
    # on|off|auto flags: the words, YAML 1.1 booleans, and the texts the build reads the same way
    ("flash-attn", [True, "on", "true", "enabled", 1, "1"], True, ["-fa", "on"]),
    ("fa", [False, "off", "false", "disabled", 0, "0"], False, ["-fa", "off"]),
    ("flash-attn", ["auto", -1, "-1"], "auto", ["-fa", "auto"]),
    ("fit", [True, "on", "enabled", 1], True, ["-fit", "on"]),
    ("fit", [False, "off", "0"], False, ["-fit", "off"]),
    # a switch: any YAML boolean word is the boolean; false is no flag, as absent is
    ("mlock", [True, "true", "on", "yes", "True"], True, ["--mlock"]),
    ("mlock", [False, "false", "off", "no", ABSENT], ABSENT, []),
    ("cpu-moe", [True, "on"], True, ["-cmoe"]),
    ("metrics", [False, "off"], ABSENT, []),
    # a pair with a negative spelling: false is the negative flag (not absent: the default may differ)
    ("kv-offload", [False, "off", "no"], False, ["-nkvo"]),
    ("no-kv-offload", [True, "on", "true"], False, ["-nkvo"]),
    ("no-mmap", [True, "yes"], False, ["--no-mmap"]),
    ("mmap", [True, "on"], True, ["--mmap"]),
    # values: the text of a number is the number; a list is what its argv reads back as
    ("threads", [2, "2", 2.0], 2, ["-t", "2"]),
    ("t", [-1, "-1"], -1, ["-t", "-1"]),
    ("defrag-thold", [0.1, "0.1", 0.10], 0.1, ["-dt", "0.1"]),
    ("tensor-split", [[3, 1], ["3", "1"], "3,1"], "3,1", ["-ts", "3,1"]),
    ("override-tensor", ["exps=CPU", ["exps=CPU"]], "exps=CPU", ["-ot", "exps=CPU"]),
    ("override-tensor", [["a=CPU", "b=CPU"]], ("a=CPU", "b=CPU"), ["-ot", "a=CPU", "-ot", "b=CPU"]),
    ("cache-type-k", ["q8_0"], "q8_0", ["-ctk", "q8_0"]),
    # a flag the table does not know: the generic rule, still one value per argv
    ("some-future-flag", [7, "7"], 7, ["--some-future-flag", "7"]),
    ("some-future-switch", [False, ABSENT], ABSENT, []),
])
def test_every_value_with_one_argv_is_one_canonical_value(name, values, canonical, argv):
    lever = LLAMA.canonical(name)
    for v in values:
        got = LLAMA.canonical_value(name, v)
        assert got == canonical and type(got) is type(canonical), (name, v, got)
        assert ([] if got is ABSENT else LLAMA.render(lever, got)) == argv, (name, v)


@pytest.mark.parametrize("name, value", [
    ("flash-attn", "yes"),          # -fa yes: the build refuses it; the boot says so, not the tuner
    ("mlock", "sometimes"),
    ("threads", "1e3"),             # 1e3 reads back as 1000.0, another argv: kept as written
    ("threads", "007"),
    ("cache-type-k", "Q8_0"),
])
def test_a_value_with_another_argv_stays_as_written(name, value):
    assert LLAMA.canonical_value(name, value) == value


def test_the_bug_a_quoted_on_baseline_and_a_yaml_on_lever_are_one_shape(tmp_path):
    from tuner.night.campaign import load_campaign
    from tuner.night.search import candidates
    from tuner.night.state import replay

    path = tmp_path / "c.yaml"
    path.write_text(f"""name: onoff
engine: llamacpp
baseline: {{image: "{IMAGE}", model: /q.gguf, args: {{flash-attn: "on", mlock: false, threads: "2", fit: "0"}}}}
levers:
  flash-attn: [on, off]
  mlock: [false, true]
  threads: [2, 1]
  fit: [enabled, "off"]
""")
    camp = load_campaign(path)
    assert dict(camp.baseline.args) == {"flash-attn": True, "threads": 2, "fit": False}
    assert camp.levers["mlock"].values == (ABSENT, True)
    proposed = {(lever, value) for _, lever, value, _ in candidates(replay([], camp.baseline), camp.levers)}
    assert proposed == {("flash-attn", False), ("mlock", True), ("threads", 1), ("fit", True)}
    for lever, value in proposed:            # each proposed arm is another command line
        assert render_argv(camp.baseline.with_change(lever, value), "llamacpp") != render_argv(camp.baseline, "llamacpp")
    again = camp.baseline.with_change("flash-attn", camp.levers["flash-attn"].values[0])
    assert again == camp.baseline and again.key() == camp.baseline.key()


@pytest.mark.parametrize("lever, first, second, argv", [
    ("flash-attn: [on, \"on\", off]", "true", '"on"', "-fa on"),
    ("fa: [1, enabled]", "1", '"enabled"', "-fa on"),
    ("flash-attn: [auto, -1]", '"auto"', "-1", "-fa auto"),
    ("mlock: [false, absent, true]", "false", "absent", "no flag"),
    ("threads: [2, \"2\"]", "2", '"2"', "-t 2"),
    ("tensor-split: [[3, 1], \"3,1\"]", "[3,1]", '"3,1"', "-ts 3,1"),
])
def test_check_refuses_a_lever_whose_two_values_are_one_argv(tmp_path, capsys, lever, first, second, argv):
    from tuner import cli

    path = tmp_path / "c.yaml"
    path.write_text(f"""name: twice
engine: llamacpp
baseline: {{image: "{IMAGE}", model: /q.gguf, args: {{threads: 1}}}}
levers:
  {lever}
""")
    assert cli.main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f":5: levers.{lever.split(':')[0]}: " in err
    assert f"values {first} and {second} both render {argv}" in err


def test_a_lever_refused_stays_refused_in_the_library():
    with pytest.raises(ConfigError, match=r'values true and "on" both render -fa on'):
        LLAMA.canonical_lever(Lever("fa", (True, "on")))
    assert LLAMA.canonical_lever(Lever("fa", (True, "off", -1))).values == (True, False, "auto")


def test_change_on_the_command_line_is_canonical_too(tmp_path):
    from tuner.night.campaign import load_campaign, parse_change

    path = tmp_path / "c.yaml"
    path.write_text(f"""name: change
engine: llamacpp
baseline: {{image: "{IMAGE}", model: /q.gguf, args: {{fa: "off"}}}}
levers: {{flash-attn: [on, off], mmap: [true, false]}}
""")
    camp = load_campaign(path)
    assert parse_change(camp, "fa=1") == ("flash-attn", True)
    assert parse_change(camp, "flash-attn=on") == ("flash-attn", True)
    assert parse_change(camp, "no-mmap=true") == ("mmap", False)
    arm = camp.baseline.with_change(*parse_change(camp, "-fa=enabled"))
    assert render_argv(arm, "llamacpp") == ["-m", "/q.gguf", "-fa", "on"]


def test_the_same_texts_are_what_the_real_build_reads():
    """Each `same:` text of the profile is a value the built llama-server accepts (the boot goes
    on to load the model), and a text outside the table is refused as the engine's own error."""
    build = subprocess.run(["bash", str(REPO / "scripts" / "build-llama-server.sh")], capture_output=True,
                           text=True, timeout=3600)
    assert build.returncode == 0, build.stderr[-2000:]
    binary = build.stdout.strip().splitlines()[-1]

    def boot(flag: str, text: str) -> str:
        r = subprocess.run([binary, "-m", "/no/such/model.gguf", flag, text, "--port", "1"],
                           capture_output=True, text=True, timeout=60)
        return r.stdout + r.stderr

    for spec in (LLAMA.specs["flash-attn"], LLAMA.specs["fit"]):
        for text, _ in spec.same:
            out = boot(spec.spell[0], text)
            assert "failed to open GGUF" in out and "unknown value" not in out, (spec.lever, text, out[-400:])
        assert f"unknown value for {spec.spell[1]}: 'yes'" in boot(spec.spell[0], "yes")
