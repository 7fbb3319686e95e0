"""Landscape files: the default loads, bad ones fail with FILE:LINE: key 'k': why."""
from __future__ import annotations

import pytest

from simengine.cli import known_flags
from simengine.landscape import DEFAULT_LANDSCAPE, LandscapeError, load_landscape
from tests.conftest import run_engine

FLAGS = known_flags()


def test_default_landscape_loads():
    land = load_landscape(None, FLAGS)
    assert land.get("name") == "seed-002"
    assert set(land["decode"]["base"]) == {166, 1087, 4064}


BAD = [
    ("malformed", "name: x\nhardware: {vram_gib: 31.86\n", r"bad\.yaml:\d+: not valid YAML"),
    ("unknown-section", "name: x\nhardwear: {}\n", r"bad\.yaml:2: key 'hardwear': unknown section"),
    ("unknown-flag", "hardware: {vram_gib: 1}\nmemory: {}\nreference: {}\ndecode: {base: {166: 1}}\n"
     "effects:\n  max-num-foo: {1: 1.1}\n", r"bad\.yaml:6: key 'effects\.max-num-foo': the engine does not accept a flag --max-num-foo"),
    ("unknown-env", "hardware: {vram_gib: 1}\nmemory: {}\nreference: {}\ndecode: {base: {166: 1}}\n"
     "effects:\n  env.NOPE_HOOK: {1: 1.1}\n", r"bad\.yaml:6: key 'effects\.env\.NOPE_HOOK': unknown env hook"),
    ("rule-flag", "hardware: {vram_gib: 1}\nmemory: {}\nreference: {}\ndecode: {base: {166: 1}}\n"
     "rules:\n  - when: {max-num-sequences: 2}\n    fail: {kind: constraint-violation}\n",
     r"bad\.yaml:6: key 'rules\[0\]\.when\.max-num-sequences': the engine does not accept"),
    ("rule-kind", "hardware: {vram_gib: 1}\nmemory: {}\nreference: {}\ndecode: {base: {166: 1}}\n"
     "rules:\n  - when: {max-num-seqs: 2}\n    fail: {kind: meltdown}\n", r"bad\.yaml:7: key 'rules\[0\]\.fail'"),
    ("bad-factor", "hardware: {vram_gib: 1}\nmemory: {}\nreference: {}\ndecode: {base: {166: 1}}\n"
     "effects:\n  max-num-seqs: {3: fast}\n", r"bad\.yaml:6: key 'effects\.max-num-seqs\.3': a factor must be a positive number"),
    ("missing-section", "hardware: {vram_gib: 1}\n", r"key 'memory': missing required section"),
    ("unknown-memory-key", "hardware: {vram_gib: 1}\nmemory:\n  slab_mb: 2\n", r"bad\.yaml:3: key 'memory\.slab_mb': unknown key"),
]


@pytest.mark.parametrize("name,text,pattern", BAD, ids=[b[0] for b in BAD])
def test_bad_landscape_is_one_line_with_file_line_key(tmp_path, name, text, pattern):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(LandscapeError, match=pattern) as ei:
        load_landscape(p, FLAGS)
    assert "\n" not in str(ei.value)


def test_engine_exits_2_on_bad_landscape(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(DEFAULT_LANDSCAPE.read_text().replace("expert-prefetch:\n    absent", "expert-prefetcher:\n    absent"))
    r = run_engine(["serve", "/models/sim", "--port", "0", "--landscape", str(p)])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "bad.yaml:" in lines[0] and "key 'effects.expert-prefetcher'" in lines[0]


def test_engine_reads_landscape_from_env(tmp_path):
    p = tmp_path / "env.yaml"
    p.write_text("name: [unclosed\n")
    r = run_engine(["serve", "/models/sim", "--port", "0"], env={"SIMENGINE_LANDSCAPE": str(p)})
    assert r.returncode == 2 and "env.yaml:" in r.stderr
