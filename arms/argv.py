"""Shape <-> engine command line, and the environment: pure functions, tested with a table.

    render_argv(shape, "vllm")      [model, --flag value, ...] in the shape's order
    render_argv(shape, "llamacpp")  [-m, model, -flag value, ...] spelled by the profile's flag
                                    table (arms.spellings): -ngl 99, -ot a=CPU -ot b=CPU, -fa on
    parse_argv(argv, style)         the way back: (model, args, port), read by the one argv
                                    reader (``FlagTable.parse``; vLLM style with an empty table)
    render_env(shape)               the container's env vars
    redact_env / redact_argv        the same with secrets replaced by ***, for the disk

Rules for one arg (name, value):
    True            --name            (llama.cpp on/off flags: --name on)
    False           vllm: --no-name   llama.cpp: left out (on/off flags: --name off)
    dict            --name '{"k":"v"}'  compact JSON, key order kept
    list            vllm: JSON        llama.cpp: comma-joined (--tensor-split 3,1)
    number          as written: 0.98, 2147483648; an integral float loses its ".0"
    string          as is
A one-letter name renders with one dash (-c 8192); others with two. llama.cpp flags the
profile's ``flags:`` table knows render with their first spelling instead (multi-letter short
flags keep their one dash: ``-ngl``, ``-ctk``, ``-ub``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from arms.errors import ConfigError
from arms.secrets import REDACTED, is_secret, looks_secret    # the one rule: names and values
from arms.shape import Shape, format_value

__all__ = ["REDACTED", "STYLES", "is_secret", "parse_argv", "redact_argv", "redact_env", "render_argv", "render_env"]

STYLES = ("vllm", "llamacpp")



def _flag(name: str) -> str:
    return ("-" if len(name) == 1 else "--") + name


def _render_vllm_arg(name: str, value: Any) -> list[str]:
    if isinstance(value, bool):
        return [_flag(name)] if value else ["--no-" + name]
    return [_flag(name), format_value(value)]


def render_argv(shape: Shape, style: str = "vllm") -> list[str]:
    """The engine's arguments (after the entrypoint) for one shape."""
    if style not in STYLES:
        raise ConfigError(f"argv style {style!r} is unknown; use one of {', '.join(STYLES)}")
    if style == "llamacpp":
        from arms.spellings import flag_table

        table = flag_table("llamacpp")
        argv = ["-m", shape.model]
        for name, value in shape.args:
            argv.extend(table.render(name, value))
        return argv
    argv = [shape.model]
    for name, value in shape.args:
        argv.extend(_render_vllm_arg(name, value))
    return argv


def parse_argv(argv: Sequence[str], style: str = "vllm") -> tuple[str, list[tuple[str, Any]], int | None]:
    """The engine's arguments after the image's entrypoint -> (model, args, port): the inverse
    of ``render_argv`` plus the ``--port`` the lifecycle appends. vLLM style takes the model as
    the first word (or ``--model``); llama.cpp style takes ``-m``/``--model`` and gives the
    profile's canonical lever names."""
    from arms.spellings import FlagTable, flag_table

    table = flag_table("llamacpp") if style == "llamacpp" else FlagTable(())
    model, args, port = table.parse(argv, style)
    if not model:
        raise ConfigError("no model in the engine arguments: " + (
            "llama.cpp style takes it after -m" if style == "llamacpp" else
            "vLLM style takes it first, llama.cpp style after -m"))
    return model, args, port


def render_env(shape: Shape) -> dict[str, str]:
    return dict(shape.env)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of env with secret values (by their name or by their look) replaced by ***."""
    return {k: (REDACTED if is_secret(k) or looks_secret(v) else v) for k, v in env.items()}


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A copy of argv with the value after a secret-looking flag (--hf-token X,
    --api-key=X), and any secret-looking value, replaced by ***."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("--"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        if arg.startswith("-") and is_secret(arg.split("=", 1)[0]):
            if "=" in arg:
                arg = arg.split("=", 1)[0] + "=" + REDACTED
            else:
                hide_next = True
        elif arg.startswith("-") and "=" in arg and looks_secret(arg.split("=", 1)[1]):
            arg = arg.split("=", 1)[0] + "=" + REDACTED
        elif looks_secret(arg):
            arg = REDACTED
        out.append(arg)
    return out
