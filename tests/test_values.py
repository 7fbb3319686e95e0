"""One lever-value codec (arms/values.py): journal JSON, Optuna's strings and the text a person
reads, each made in one place."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from arms.shape import ABSENT, format_value
from arms import values

SPEC = {"method": "mtp", "num_speculative_tokens": 4}


@pytest.mark.parametrize("v, as_json, text", [
    (1, 1, "1"), (0.95, 0.95, "0.95"), ("fp8", "fp8", "fp8"), (True, True, "true"),
    (SPEC, SPEC, json.dumps(SPEC, separators=(",", ":"))), (ABSENT, {"__absent__": True}, "absent"),
])
def test_journal_json_round_trip_and_text(v, as_json, text):
    enc = values.encode(v)
    assert enc == as_json
    back = values.decode(json.loads(json.dumps(enc)))          # through the journal's bytes
    assert back is ABSENT if v is ABSENT else back == v
    assert values.text(v) == values.text_of(enc) == format_value(v) == text
    assert values.change_text(("lever", v)) == f"lever → {text}" and values.change_text(None) == "—"


def test_the_study_string_is_sealed_and_joint_choices_stay_distinct():
    token = "hf_" + "Ab1" * 8
    assert values.param("expert-prefetch", 2) == "2"
    assert values.param("expert-prefetch", ABSENT) == '{"__absent__": true}'
    assert values.param("env.HF_TOKEN", "plain-secret") == '"***"'            # a secret by its name
    assert values.param("model-tag", token) == '"***"'                        # a secret by its look
    vals = ["plainvalue", token, "other" + token, 3]
    ch = values.choices("env.R4D_AUTH_MODE", vals)
    assert ch == ['"plainvalue"', '"*** #1"', '"*** #2"', "3"] and len(set(ch)) == len(vals)
    assert [values.from_choice("env.R4D_AUTH_MODE", vals, c) for c in ch] == vals
    assert [values.choice_of("env.R4D_AUTH_MODE", vals, v) for v in vals] == ch
    assert all(token not in c for c in ch)
    secret = values.choices("env.API_KEY", ["k1-long-enough", "k2-long-enough"])
    assert secret == ['"*** #0"', '"*** #1"']


def test_no_other_lever_value_wrapper_in_the_tuner():
    """Text, journal JSON and study strings of a lever value come from arms/values.py only
    (units.py and envfile.py spell values for a unit file, the engine's spelling)."""
    import tuner

    root = Path(tuner.__file__).parent
    allowed = {"units.py", "envfile.py"}
    for p in sorted(root.rglob("*.py")):
        if p.name in allowed:
            continue
        src = p.read_text()
        assert not re.search(r"\bformat_value\(|def _fmt\(|def _vt\(|def _value_text\(|def trial_attr\(|"
                             r"def change_value_text\(|def encode_value\(|def decode_value\(", src), p.name
