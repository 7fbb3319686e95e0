"""Boot-log parsing: fixture pairs (NAME.log + NAME.expected.yaml) plus focused tests.

An ``expected.yaml`` holds ``profile``, optional ``exit_code`` / ``oom_killed`` /
``outcome_hint``, and ``expect``: BootReport fields that matter for the case. Dicts
(``plan``, ``non_default_args``, ``failure_detail``, ``oom_detail``) are compared as subsets
(an empty dict means "must be empty"); ``evidence_contains`` lists substrings that must each
appear in some evidence line; ``plan_lacks`` lists plan keys that must be absent.
"""
from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from arms.bootlog import BootReport, clean_log_lines, parse_boot_log
from arms.errors import ConfigError
from arms.flags import flags_not_applied
from arms.profiles import CLASSES, EngineProfile, load_profile

FIXTURES = Path(__file__).parent / "fixtures" / "boot_logs"
CASES = sorted(FIXTURES.glob("*.expected.yaml"))
REPORT_FIELDS = {f.name for f in fields(BootReport)}


def _load_case(path: Path) -> tuple[dict, str]:
    case = yaml.safe_load(path.read_text(encoding="utf-8"))
    log = path.with_name(path.name.replace(".expected.yaml", ".log"))
    return case, log.read_bytes().decode("utf-8")


def _same(expected, actual) -> bool:
    if isinstance(expected, bool) or expected is None:
        return actual is expected or actual == expected and type(actual) is type(expected)
    if isinstance(expected, float) or isinstance(actual, float):
        return isinstance(actual, (int, float)) and not isinstance(actual, bool) and \
            math.isclose(expected, actual, rel_tol=1e-4, abs_tol=1e-6)
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return False
        if not expected:
            return actual == {}
        return all(k in actual and _same(v, actual[k]) for k, v in expected.items())
    if isinstance(expected, list):
        actual = list(actual) if isinstance(actual, (list, tuple)) else actual
        return isinstance(actual, list) and len(actual) == len(expected) and \
            all(_same(e, a) for e, a in zip(expected, actual))
    return expected == actual


@pytest.mark.parametrize("case_path", CASES, ids=[p.name.split(".")[0] for p in CASES])
def test_fixture(case_path: Path) -> None:
    case, text = _load_case(case_path)
    report = parse_boot_log(text, load_profile(case["profile"]), exit_code=case.get("exit_code"),
                            oom_killed=case.get("oom_killed", False),
                            outcome_hint=case.get("outcome_hint"))
    for key, want in case["expect"].items():
        if key == "evidence_contains":
            for needle in want:
                assert any(needle in line for line in report.evidence), (needle, report.evidence)
        elif key == "plan_lacks":
            assert not set(want) & set(report.plan), report.plan
        else:
            assert key in REPORT_FIELDS, f"{case_path.name}: unknown BootReport field {key!r}"
            got = getattr(report, key)
            assert _same(want, got), f"{key}: expected {want!r}, got {got!r}"
    json.dumps(report.to_dict())                     # journal-ready


def test_fixtures_cover_every_class() -> None:
    seen = {yaml.safe_load(p.read_text())["expect"].get("outcome") for p in CASES}
    assert len(CASES) >= 34
    assert CLASSES | {"ready"} <= seen, sorted(CLASSES | {"ready"} - seen)


def test_every_fixture_log_has_an_expectation() -> None:
    logs = {p.name[:-4] for p in FIXTURES.glob("*.log")}
    assert logs == {p.name.split(".expected")[0] for p in CASES}


# ---------------------------------------------------------------- ordering and decisions
VLLM = load_profile("vllm")
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total "
       "capacity of 14.57 GiB of which 1.58 GiB is free. Including non-PyTorch memory, this process has 12.9 GiB")
INIT = ("RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore_DP0': 1}")


def test_most_specific_wins_regardless_of_line_order() -> None:
    for text in (f"{OOM}\n{INIT}\n", f"{INIT}\n{OOM}\n"):
        report = parse_boot_log(text, VLLM, exit_code=1)
        assert report.outcome == "oom"
        assert report.evidence == (OOM,)
        assert report.oom_detail == {"tried_to_allocate_gib": 1.95, "gpu": 0, "total_gib": 14.57, "free_gib": 1.58}


def test_generic_only_when_nothing_specific() -> None:
    report = parse_boot_log(f"AssertionError: block table mismatch\n{INIT}\n", VLLM, exit_code=1)
    assert report.outcome == "engine-init-failed"
    assert report.evidence == ("AssertionError: block table mismatch", INIT)


def test_profile_order_decides_between_specific_classes() -> None:
    kv = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`."
    assert parse_boot_log(f"{OOM}\n{kv}\n", VLLM, exit_code=1).outcome == "kv-too-small"
    swapped = load_profile("vllm", {"failures": [
        {"class": "oom", "pattern": "OutOfMemoryError"},
        {"class": "kv-too-small", "pattern": "No available memory for the cache blocks"}]})
    assert parse_boot_log(f"{OOM}\n{kv}\n", swapped, exit_code=1).outcome == "oom"


def test_generic_root_cause_found_after_an_early_generic_line() -> None:
    # the simulated engine logs the API server's trailer at INFO; the root follows the first line
    text = ("(EngineCore_DP0 pid=7) ERROR 11-29 21:27:08 [core.py:708] EngineCore failed to start.\n"
            "(EngineCore_DP0 pid=7) ERROR 11-29 21:27:08 [core.py:708] RuntimeError: PLE inputs were not prepared\n"
            f"(APIServer pid=1) INFO 11-29 21:27:08 [launcher.py:101] {INIT}\n")
    report = parse_boot_log(text, VLLM, exit_code=1)
    assert report.outcome == "engine-init-failed"
    assert report.evidence == ("RuntimeError: PLE inputs were not prepared", "EngineCore failed to start.")


def test_quiet_levels_never_decide_a_failure() -> None:
    text = ("(EngineCore_DP0 pid=5) WARNING 11-29 21:30:00 [fp8.py:154] DeepGEMM is not supported on this GPU\n"
            f"{INIT}\n")
    assert parse_boot_log(text, VLLM, exit_code=1).outcome == "engine-init-failed"


def test_ready_wins_over_noise_but_not_over_a_later_crash() -> None:
    ready = "(APIServer pid=1) INFO:     Application startup complete.\n"
    noise = "(EngineCore_DP0 pid=5) ERROR 11-29 21:30:00 [x.py:1] CUDA graph for size 3 is not supported\n"
    assert parse_boot_log(noise + ready, VLLM).outcome == "ready"
    assert parse_boot_log(noise + ready, VLLM, exit_code=0).evidence == ("Application startup complete.",)
    assert parse_boot_log(ready + OOM + "\n", VLLM).outcome == "oom"          # a worker died, server alive
    assert parse_boot_log(ready + OOM + "\n", VLLM, exit_code=1).outcome == "oom"
    # the process died after ready: explain the death from what came after the ready line
    assert parse_boot_log(noise + ready, VLLM, exit_code=137).outcome == "host-oom-killed"
    assert parse_boot_log(noise + ready, VLLM, exit_code=1).outcome == "unknown"
    assert parse_boot_log(ready, VLLM, oom_killed=True).outcome == "host-oom-killed"


@pytest.mark.parametrize("hint", ["boot-timeout", "hang"])
def test_outcome_hint_applies_only_without_a_log_cause(hint: str) -> None:
    stalled = "(EngineCore_DP0 pid=5) INFO 11-29 21:30:00 [weight_utils.py:392] Using model weights format\n"
    report = parse_boot_log(stalled, VLLM, exit_code=137, outcome_hint=hint)
    assert report.outcome == hint
    assert report.evidence == ("Using model weights format",)
    assert parse_boot_log(stalled + OOM, VLLM, outcome_hint=hint).outcome == "oom"
    assert parse_boot_log(stalled + INIT, VLLM, outcome_hint=hint).outcome == "engine-init-failed"
    assert parse_boot_log(stalled, VLLM, exit_code=137).outcome == "host-oom-killed"
    assert parse_boot_log(stalled, VLLM, exit_code=1).outcome == "unknown"


def test_outcome_hint_is_checked() -> None:
    with pytest.raises(ValueError, match="outcome_hint"):
        parse_boot_log("", VLLM, outcome_hint="ready")


def test_empty_log() -> None:
    report = parse_boot_log("", VLLM, exit_code=1)
    assert report.outcome == "unknown" and report.evidence == () and report.plan == {}


# ---------------------------------------------------------------- noise
def test_ansi_crlf_and_prefixes_are_cleaned() -> None:
    text = ("\x1b[1;36m(EngineCore_DP0 pid=245)\x1b[0;0m INFO 10-12 08:01:50 [gpu_worker.py:298] "
            "Available KV cache memory: 52.36 GiB\r\n"
            "vllm-text-1  | (APIServer pid=1) INFO 10-12 08:01:50 [loggers.py:147] Engine 000: idle\r\n"
            "(RayWorkerWrapper pid=123, ip=10.0.0.2) [rank1]: Traceback (most recent call last):\r\n"
            "Loading shards:  50% | 1/2\rLoading shards: 100% | 2/2\r\n"
            "Oct 02 09:20:16 dankserver frank-primary[4242]: (APIServer pid=1) INFO:     Application startup complete.\n")
    assert clean_log_lines(text, VLLM) == [
        "Available KV cache memory: 52.36 GiB", "Engine 000: idle", "Traceback (most recent call last):",
        "Loading shards:  50% | 1/2", "Loading shards: 100% | 2/2", "Application startup complete."]
    report = parse_boot_log(text, VLLM)
    assert report.outcome == "ready" and report.available_kv_gib == 52.36


def test_two_records_on_one_line_are_split() -> None:
    text = ("(APIServer pid=1) INFO 11-29 21:30:00 [utils.py:278] non-default args: {'max_num_seqs': 3}"
            "(EngineCore_DP0 pid=7) INFO 11-29 21:30:01 [core.py:93] Initializing a V1 LLM engine (v0.33.0) with config\n")
    report = parse_boot_log(text, VLLM)
    assert report.non_default_args == {"max_num_seqs": 3}
    assert report.engine_version == "0.33.0"


def test_journald_split_line_is_rejoined_for_the_class() -> None:
    text = ("ValueError: To serve at least one request with the model's max seq len (262144), (4.0 GiB KV cache is "
            "needed, which is larger than the avai\n"
            "lable KV cache memory (3.0 GiB). Based on the available memory, the estimated maximum model length is "
            f"184224. Try increasing\n{INIT}\n")
    report = parse_boot_log(text, VLLM, exit_code=1)
    assert report.outcome == "kv-too-small"
    assert report.failure_detail["estimated_max_model_len"] == 184224


def test_unparsable_non_default_args_keep_the_raw_text() -> None:
    text = ("(APIServer pid=1) INFO 11-29 21:30:00 [utils.py:278] non-default args: "
            "{'model_tag': 'm', 'compilation_config': CompilationConfig(mode=3)}\n")
    report = parse_boot_log(text, VLLM)
    assert report.non_default_args == {}
    assert report.non_default_args_raw == "{'model_tag': 'm', 'compilation_config': CompilationConfig(mode=3)}"


def test_numbers_with_thousands_separators_and_v0_blocks() -> None:
    report = parse_boot_log("# GPU blocks: 27,153, # CPU blocks: 2,048\nblock_size=16, x\n", VLLM)
    assert (report.kv_blocks, report.kv_block_size, report.kv_pool_tokens) == (27153, 16, 434448)
    assert parse_boot_log("# GPU blocks: 27153, # CPU blocks: 2048\n", VLLM).kv_pool_tokens is None
    sized = load_profile("vllm", {"kv_block_size": 16})
    assert parse_boot_log("# GPU blocks: 27153, # CPU blocks: 2048\n", sized).kv_pool_tokens == 434448


def test_to_dict_is_json_ready() -> None:
    text = "(APIServer pid=1) INFO 11-29 21:30:00 [utils.py:278] non-default args: {'a': (1, 2), 'b': {3}}\n"
    data = parse_boot_log(text, VLLM).to_dict()
    assert data["non_default_args"] == {"a": [1, 2], "b": [3]}
    assert json.loads(json.dumps(data))["outcome"] == "unknown"


# ---------------------------------------------------------------- flag-landed check
ARGS = {"model_tag": "/m", "max_model_len": 32768, "gpu_memory_utilization": 0.98,
        "expert_precise_memory": True, "enable_prefix_caching": False,
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 4},
        "compilation_config": {"mode": 3, "cudagraph_mode": "PIECEWISE"}}


@pytest.mark.parametrize("changed, offending", [
    ({"--expert-precise-memory": True}, []),
    ({"expert-precise-memory": "true"}, []),
    ({"--max-model-len": "32768"}, []),
    ({"--max-model-len": "32K"}, []),
    ({"--max-model-len": "32k"}, ["--max-model-len"]),           # 32k = 32000 in vLLM
    ({"--max-model-len": 16384}, ["--max-model-len"]),
    ({"--gpu-memory-utilization": "0.98"}, []),
    ({"--speculative-config": '{"num_speculative_tokens": 4, "method": "mtp"}'}, []),
    ({"--speculative-config": {"method": "mtp", "num_speculative_tokens": 3}}, ["--speculative-config"]),
    ({"--expert-prefetch": None}, []),                             # removed, and absent: landed
    ({"--expert-precise-memory": None}, ["--expert-precise-memory"]),  # removed, still there
    ({"--expert-prefetch": 1}, ["--expert-prefetch"]),             # silently dropped
    ({"--no-enable-prefix-caching": True}, []),
    ({"--compilation-config.mode": 3}, []),
    ({"env.R4D_LRU_GATHER_CHUNKS": 32}, []),                       # env levers are not checked here
    ({"--max-num-seqs": 4, "--expert-prefetch": 2, "--max-model-len": 32768},
     ["--max-num-seqs", "--expert-prefetch"]),
])
def test_flags_not_applied(changed: dict, offending: list) -> None:
    assert flags_not_applied(changed, ARGS) == offending


def test_flag_set_to_its_default_may_be_missing() -> None:
    assert flags_not_applied({"--max-num-seqs": 1024}, ARGS, defaults={"max-num-seqs": 1024}) == []
    assert flags_not_applied({"--max-num-seqs": 4}, ARGS, defaults={"max-num-seqs": 1024}) == ["--max-num-seqs"]


# ---------------------------------------------------------------- profiles
def test_shipped_profiles_load() -> None:
    offload = load_profile("vllm-expert-offload")
    assert isinstance(offload, EngineProfile) and offload.telemetry and not offload.ignores_eos
    assert load_profile("simengine").ignores_eos
    assert not VLLM.telemetry
    llama = load_profile("llamacpp")
    assert (llama.tokenize_request_key, llama.health_path) == ("content", "/health")
    assert VLLM.spec_decode_metrics["drafts"] == "vllm:spec_decode_num_drafts_total"
    assert VLLM.arg_key_style == "snake_case" and VLLM.non_default_args_style == "python-dict"
    assert hash(offload) == hash(load_profile("vllm-expert-offload"))


def test_overrides_change_regexes_without_code() -> None:
    fork = load_profile("vllm", {"readiness": {"ready_line": "ENGINE READY"},
                                 "fields": {"available_kv": r"KV budget (?P<available_kv_gib>[\d.]+) GiB"},
                                 "failures_extra": [{"class": "unsupported", "pattern": "PLE inputs"}]})
    report = parse_boot_log("KV budget 3.5 GiB\nENGINE READY\n", fork)
    assert report.outcome == "ready" and report.available_kv_gib == 3.5
    assert parse_boot_log(f"RuntimeError: PLE inputs were not prepared\n{INIT}\n", fork).outcome == "unsupported"
    dropped = load_profile("vllm", {"fields": {"available_kv": None}})
    assert parse_boot_log("Available KV cache memory: 2.0 GiB\n", dropped).available_kv_gib is None


@pytest.mark.parametrize("overrides, message", [
    ({"fields": {"x": "("}}, r"campaign overrides: key 'fields\.x' is not a valid regex"),
    ({"fields": {"x": "(?P<bogus>\\d+)"}}, r"campaign overrides: key 'fields\.x' uses unknown named group"),
    ({"readines": {}}, r"campaign overrides: unknown key 'readines'"),
    ({"readiness": {"healt_path": "/h"}}, r"unknown key 'readiness\.healt_path'"),
    ({"telemetry": "yes"}, r"key 'telemetry' must be a bool"),
    ({"failures": [{"class": "explosion", "pattern": "x"}]}, r"key 'failures\[0\]\.class' is 'explosion'"),
    ({"non_default_args": {"line": "no group here"}}, r"needs a named group \(\?P<args>"),
])
def test_bad_overrides_are_config_errors(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_profile("vllm", overrides)
    assert "\n" not in str(info.value)


def test_bad_profile_files_name_the_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "fork.yaml"
    bad.write_text("extends: vllm\nname: fork\nnoise:\n  strip: ['[unclosed']\n")
    with pytest.raises(ConfigError, match=r"fork\.yaml: key 'noise\.strip\[0\]' is not a valid regex"):
        load_profile(str(bad))
    bad.write_text("extends: vllm\nname: fork\ncolour: blue\n")
    with pytest.raises(ConfigError, match=r"fork\.yaml: unknown key 'colour'"):
        load_profile(str(bad))
    bad.write_text("name: fork\nfamily: vllm\n")
    with pytest.raises(ConfigError, match=r"fork\.yaml: missing key 'readiness\.health_path'"):
        load_profile(str(bad))
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match=r"fork\.yaml: line \d+ not valid YAML"):
        load_profile(str(bad))
    with pytest.raises(ConfigError, match="shipped profiles: .*vllm"):
        load_profile("no-such-engine")
    good = tmp_path / "fork2.yaml"
    good.write_text("extends: vllm-expert-offload\nname: fork2\ntelemetry: false\n")
    assert load_profile(str(good)).name == "fork2" and not load_profile(str(good)).telemetry


# -- total and bounded ------------------------------------------------------------------------
@pytest.mark.parametrize("line,field,raw", [
    ("INFO 01-01 00:00:00 [default_loader.py:262] Model loading took 1.2.3 GiB and 5 seconds",
     "model_load_gib", "1.2.3"),
    ("INFO 01-01 00:00:00 [gpu_model_runner.py:2000] Model loading took 17.5 GiB and 1e999 seconds",
     "model_load_s", None),
    ("INFO 01-01 00:00:00 [kv_cache_utils.py:1000] GPU KV cache size: 1,2,,, tokens", None, None),
])
def test_a_number_that_does_not_parse_is_none_with_its_raw_text(line, field, raw) -> None:
    rep = parse_boot_log(line + "\n", load_profile("vllm"))
    json.dumps(rep.to_dict())
    if field:
        assert getattr(rep, field) is None or isinstance(getattr(rep, field), float)
    if raw:
        assert rep.unparsed[field] == raw and getattr(rep, field) is None


def test_an_unparsable_size_in_a_failure_or_oom_line_is_kept_raw() -> None:
    log = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.2.3 GiB. GPU 0 has a "
           "total capacity of 23.5 GiB of which 0.5.5 GiB is free.\n")
    rep = parse_boot_log(log, load_profile("vllm"), exit_code=1)
    assert rep.outcome == "oom"
    assert rep.oom_detail["tried_to_allocate_gib"] is None and rep.oom_detail["total_gib"] == 23.5
    assert rep.unparsed["tried_to_allocate_gib"] == "1.2.3 GiB"


def test_an_over_long_log_keeps_head_and_tail() -> None:
    from arms.bootlog import clip_log

    text = "a" * 100 + "b" * 100
    clipped, gone = clip_log(text, 50)
    assert gone == 150 and clipped.startswith("a" * 25) and clipped.endswith("b" * 25)
    assert clip_log(text, 500) == (text, 0)


GENERIC_UNITS = ("a", "A", "0", " ", "\t", "\x00", ".", ",", "(", ")", "{", "-", "_", ":", "=", "#",
                 "\u00a0", "a ", "0.", "= ", " (")


def _patterns(p: EngineProfile) -> list:
    return [p.ready_pattern] + [x for x in (p.non_default_args_pattern, p.split_pattern,
            p.exception_pattern, p.frame_pattern, p.compile_hit_pattern, p.compile_miss_pattern,
            p.oom_pattern) if x is not None] + list(p.strip_patterns) \
        + [x for _, x in p.field_patterns] + [f.pattern for f in p.failures]


_CATEGORY_CHAR = {"CATEGORY_DIGIT": "0", "CATEGORY_SPACE": " ", "CATEGORY_WORD": "a",
                  "CATEGORY_NOT_SPACE": "a", "CATEGORY_NOT_DIGIT": "a", "CATEGORY_NOT_WORD": " "}


def _one(op, av) -> str:
    """A short string one regex node matches (a sample, not all of them)."""
    name = str(op)
    if name == "LITERAL":
        return chr(av)
    if name in ("NOT_LITERAL", "ANY"):
        return "a" if av != ord("a") else "b"
    if name == "IN":
        if av and str(av[0][0]) == "NEGATE":
            return next(c for c in "a0 x,(" if not re_fullmatch(av, c))
        o, v = av[0]
        return {"LITERAL": lambda: chr(v), "RANGE": lambda: chr(v[0]),
                "CATEGORY": lambda: _CATEGORY_CHAR.get(str(v), "a")}.get(str(o), lambda: "a")()
    if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        return "".join(_one(*x) for x in av[2]) * max(av[0], 1)
    if name == "SUBPATTERN":
        return "".join(_one(*x) for x in av[-1])
    if name == "ATOMIC_GROUP":
        return "".join(_one(*x) for x in av)
    if name == "BRANCH":
        return "".join(_one(*x) for x in av[1][0])
    return ""                                     # anchors, lookarounds, group references


def re_fullmatch(av, c: str) -> bool:
    import re

    body = "".join(re.escape(chr(v)) if str(o) == "LITERAL" else "" for o, v in av[1:])
    return bool(body) and c in body


def _prefixes(pattern) -> set[str]:
    """Prefixes (at node boundaries) of a sample match of each top-level alternative: repeated,
    each one starts a match attempt that an unbounded `.*`, `\\S+`, `\\w*` after it drags to the
    end of the line."""
    import re._parser as sre

    top = list(sre.parse(pattern.pattern))
    alts = [list(a) for a in top[0][1][1]] if len(top) == 1 and str(top[0][0]) == "BRANCH" else [top]
    out: set[str] = set()
    for items in alts:
        text = ""
        for op, av in items:
            text += _one(op, av)
            if len(text) >= 3:
                out |= {text, text + " ", text[:-1]}
    return out


def _search_s(pattern, text: str, tries: int = 3) -> float:
    """The search's CPU time (this thread's: time spent waiting for a core on a loaded machine
    does not count, so the growth ratio is the regex's, not the scheduler's), best of `tries`."""
    import time

    best = float("inf")
    for _ in range(tries):
        t0 = time.thread_time()
        pattern.search(text)
        best = min(best, time.thread_time() - t0)
    return best


def test_every_profile_regex_is_linear_on_adversarial_lines() -> None:
    """Each regex of every shipped profile on a line of one repeated unit (common characters,
    and every literal piece of the regex itself: the trap of `\\S+ model buffer size =` or
    `X.*Y`), 4k and 32k characters long: linear time grows 8x, quadratic 64x. A complexity
    check, not a speed target: only a search over 0.1 s at 32k characters is compared at all
    (the quadratic ones took 0.3-7 s there), the best of three timings each. Absolute times
    are in bench/parser_timing.py."""
    from arms.profiles import PROFILE_DIR

    names = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))
    pats = {pat.pattern: pat for name in names for pat in _patterns(load_profile(name))}
    bad = []
    for pat in pats.values():
        for unit in (*GENERIC_UNITS, *sorted(_prefixes(pat))):
            reps = 32768 // len(unit) + 1
            if _search_s(pat, unit * reps, 1) > 0.1 and all(      # three rounds: a busy CI runner
                    (big := _search_s(pat, unit * reps)) > 0.1
                    and big / max(_search_s(pat, unit * (reps // 8)), 1e-6) > 25 for _ in range(3)):
                bad.append(f"{pat.pattern[:60]!r} on {unit!r}: {big:.2f} s at 32k characters")
    assert len(pats) > 40 and not bad, bad


def test_nuls_random_bytes_and_huge_lines_parse_to_a_report() -> None:
    import random

    rnd = random.Random(7)
    junk = bytes(rnd.getrandbits(8) for _ in range(300_000)).decode("latin-1")
    for text in ("\x00" * 200_000, junk, "x" * 300_000 + "\nllama_server: listening on http://0:1\n"):
        for name in ("llamacpp", "vllm"):
            rep = parse_boot_log(text, load_profile(name), exit_code=1)
            assert rep.outcome in CLASSES and json.dumps(rep.to_dict())


# ---------------------------------------------------------------- vLLM's CPU build (issue 22)
CPU_READY = ("(Worker pid=31) INFO 12-01 20:34:32 [cpu_worker.py:260] Explicitly set (1.0/23.54) GiB for KV cache on node 0.\n"
             "(EngineCore pid=18) INFO 12-01 20:34:32 [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens, "
             "Maximum concurrency for 2,048 tokens per request: 256.00x\n"
             "(APIServer pid=1) INFO:     Application startup complete.\n")
DEAD = ("(APIServer pid=1) ERROR 12-01 20:42:56 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: "
        "EngineCore encountered an issue. See stack trace (above) for the root cause.")


def test_an_engine_that_dies_after_ready_is_engine_dead_with_the_tracebacks_last_line() -> None:
    for exit_code in (None, 0, 1):       # still shutting down, or gone (the API server exits 0)
        report = parse_boot_log(CPU_READY + DEAD + "\n", VLLM, exit_code=exit_code)
        assert report.outcome == "engine-dead"
        assert report.evidence == (DEAD.split("] ", 1)[1],)
        assert report.kv_pool_tokens == 524288       # the plan of the boot that did come up stays


def test_engine_dead_is_not_the_generic_init_failure_any_more() -> None:
    report = parse_boot_log(f"AssertionError: block table mismatch\n{INIT}\n", VLLM, exit_code=1)
    assert report.outcome == "engine-init-failed"
    worker = "(EngineCore pid=17) ERROR 12-01 20:42:56 [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor."
    assert parse_boot_log(CPU_READY + worker + "\n", VLLM).outcome == "engine-dead"
    # a traceback frame that only names the class decides nothing
    frame = '  File "/opt/vllm/lib/python3.11/site-packages/vllm/v1/engine/core_client.py", line 787, in call\n    raise EngineDeadError()\n'
    assert parse_boot_log(CPU_READY + frame, VLLM).outcome == "ready"


def test_the_cpu_kv_space_lines_fill_the_plan() -> None:
    auto = ("INFO 12-01 20:34:32 [cpu_worker.py:260] Auto set (10.89/23.54) GiB for KV cache on node 0, with 22.36 GiB "
            "requested memory for the worker. 11.47 GiB memory was consumed by non-kv usages.\n")
    for text, kv in ((CPU_READY, 1.0), (auto + CPU_READY.split("\n", 1)[1], 10.89)):
        report = parse_boot_log(text, VLLM)
        assert report.plan["kv_pool_gib"] == kv and report.plan["total_gib"] == 23.54
        assert (report.kv_pool_tokens, report.max_concurrency, report.max_concurrency_len) == (524288, 256.0, 2048)


def test_a_saved_aot_model_that_does_not_load_is_a_compile_cache_miss_with_its_reason() -> None:
    load_failed = ("WARNING 12-01 20:36:55 [decorators.py:333] [backbone] Compiling model again due to a load failure "
                   "from /root/.cache/vllm/torch_compile_cache/torch_aot_compile/7400/rank_0_0/model, reason: "
                   "'function' object has no attribute 'finalize_loading'\n")
    saved = ("INFO 12-01 20:37:29 [decorators.py:743] [backbone] saved AOT compiled function to "
             "/root/.cache/vllm/torch_compile_cache/torch_aot_compile/7400/rank_0_0/model\n")
    loaded = ("INFO 12-01 20:37:29 [decorators.py:320] [backbone] Directly load AOT compilation from path "
              "/root/.cache/vllm/torch_compile_cache/torch_aot_compile/7400/rank_0_0/model\n")
    report = parse_boot_log(load_failed + saved + CPU_READY, VLLM)
    assert report.compile_cache_hit is False
    assert report.plan["compile_cache_load_error"] == "'function' object has no attribute 'finalize_loading'"
    assert report.plan["compile_cache_saved"] is True
    hit = parse_boot_log(loaded + CPU_READY, VLLM)
    assert hit.compile_cache_hit is True and "compile_cache_saved" not in hit.plan


@pytest.mark.parametrize("line, detail", [
    ("ValueError: Available memory on node 0 (12.75/14.21 GiB) on kv cache allocation is less than requested memory "
     "for kv (16.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.",
     {"node": 0, "free_gib": 12.75, "total_gib": 14.21, "requested_gib": 16.0}),
    ("ValueError: Available memory on node 0 (12.87/14.21 GiB) on startup is less than desired CPU memory utilization "
     "(0.99, 14.07 GiB). Decrease CPU memory utilization or reduce CPU memory used by other processes.",
     {"node": 0, "free_gib": 12.87, "util": 0.99, "requested_util_gib": 14.07}),
])
def test_host_memory_short_of_the_cpu_builds_request(line, detail) -> None:
    report = parse_boot_log(f"ERROR 12-01 20:50:01 [core.py:1100] {line}\n{INIT}\n", VLLM, exit_code=1)
    assert report.outcome == "insufficient-memory-for-utilization"
    assert report.failure_detail == detail | ({"total_gib": 14.21} if "util" in detail else {})
