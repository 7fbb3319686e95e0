"""Flag spellings as data: one canonical lever name per engine flag, and every way to write it.

A profile's ``flags:`` section (arms/profiles/llamacpp.yaml) lists, per canonical lever name,
the spellings the engine accepts (the first is the one the tuner writes), the negative
spellings of a boolean pair (``-nkvo``), the value style and the ``LLAMA_ARG_*`` env name:

    n-gpu-layers:    {spell: [-ngl, --n-gpu-layers, --gpu-layers], env: LLAMA_ARG_N_GPU_LAYERS}
    override-tensor: {spell: [-ot, --override-tensor], repeat: true}
    flash-attn:      {spell: [-fa, --flash-attn], words: [on, off], env: LLAMA_ARG_FLASH_ATTN}
    cpu-moe:         {spell: [-cmoe, --cpu-moe], bare: true}
    kv-offload:      {spell: [-kvo, --kv-offload], negative: [-nkvo, --no-kv-offload]}
    fit:             {spell: [-fit], words: [on, off], same: {enabled: true, '1': true, '0': false}}

Value styles, by lever value:
  True / False   ``bare``: ``-cmoe`` / left out; ``words``: ``-fa on`` / ``-fa off``;
                 ``negative``: ``-kvo`` / ``-nkvo``
  list           ``repeat``: one flag per item (``-ot a=CPU -ot b=CPU``); else comma-joined
  other          ``-flag value`` (a string such as ``auto`` passes through words flags too)

``same`` lists the other value texts the engine reads as one of these values (llama.cpp's
``-fa 1`` / ``-fa enabled`` are ``-fa on``; ``-fa -1`` is ``-fa auto``).

Canonical values (``canonical_value``): a campaign's value is stored as ``parse(render(value))``
after its ``same`` text and, for a switch (bare or negative pair), a YAML boolean word
(``"on"``, ``"true"``, ``"no"``) became the boolean it means; a switch's false is ABSENT (both
leave the flag out). So two values are one shape exactly when they are one argv:
``flash-attn: "on"``, ``on`` (YAML 1.1 true) and ``1`` are all ``-fa on``; ``threads: "2"`` is
``threads: 2``. ``canonical_lever`` refuses a lever two of whose values render one argv.

``render`` and ``parse`` are inverses (tests/test_argv.py holds the table): parse accepts any
spelling, ``--flag=value``, ``_`` for ``-`` in long names (llama.cpp does the same) and gives
canonical names; render writes the first spelling. A name the table does not know renders the
generic way: one dash for one letter, two otherwise.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from arms.errors import ConfigError
from arms.shape import ABSENT, Lever, Shape, format_value

__all__ = ["FlagSpec", "FlagTable", "flag_table"]

_INT = re.compile(r"-?(0|[1-9][0-9]*)\Z")
_FLOAT = re.compile(r"-?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]+)\Z")
_SPEC_KEYS = {"spell", "negative", "words", "bare", "repeat", "env", "same"}
# the YAML 1.1 boolean words: a switch takes no value, so one of these can only mean the boolean
_YES = frozenset("y Y yes Yes YES true True TRUE on On ON".split())
_NO = frozenset("n N no No NO false False FALSE off Off OFF".split())


def typed(text: str) -> Any:
    """A value's text back to the value ``format_value`` wrote: ints, floats, JSON; else text."""
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def _is_flag(tok: str) -> bool:
    return tok.startswith("-") and len(tok) > 1 and not _INT.match(tok) and not _FLOAT.match(tok)


def _bare_name(spelling: str) -> str:
    return spelling.lstrip("-")


@dataclass(frozen=True)
class FlagSpec:
    lever: str                          # canonical lever name (n-gpu-layers)
    spell: tuple[str, ...]              # with dashes; the first is written
    negative: tuple[str, ...] = ()      # the False spellings of a boolean pair
    words: tuple[str, str] | None = None   # (True word, False word): -fa on / -fa off
    bare: bool = False                  # a switch: present or left out
    repeat: bool = False                # a list renders as one flag per item
    env: str | None = None              # LLAMA_ARG_* equivalent
    same: tuple[tuple[str, Any], ...] = ()   # other texts of a value: ("1", True), ("-1", "auto")

    @property
    def switch(self) -> bool:
        """A flag that takes no value: bare, or a pair with a negative spelling."""
        return not self.takes_value

    @property
    def takes_value(self) -> bool:
        return not self.bare and not (self.negative and not self.words)

    def render(self, value: Any) -> list[str]:
        flag = self.spell[0]
        if isinstance(value, bool):
            if self.words:
                return [flag, self.words[0] if value else self.words[1]]
            if self.negative:
                return [flag] if value else [self.negative[0]]
            return [flag] if value else []
        if isinstance(value, (list, tuple)):
            if self.repeat:
                return [w for v in value for w in (flag, format_value(v))]
            return [flag, ",".join(format_value(v) for v in value)]
        return [flag, format_value(value)]


class FlagTable:
    """The spellings of one engine's flags; lookups by any spelling, with or without dashes."""

    def __init__(self, specs: Iterable[FlagSpec]) -> None:
        self.specs: dict[str, FlagSpec] = {}
        self._by_spelling: dict[str, tuple[FlagSpec, bool]] = {}
        self._by_env: dict[str, FlagSpec] = {}
        for spec in specs:
            self.specs[spec.lever] = spec
            for s in spec.spell + (f"--{spec.lever}",):
                self._add(s, spec, True)
            for s in spec.negative:
                self._add(s, spec, False)
            if spec.env:
                self._by_env[spec.env] = spec

    def _add(self, spelling: str, spec: FlagSpec, positive: bool) -> None:
        other = self._by_spelling.get(spelling)
        if other is not None and other[0].lever != spec.lever:
            raise ConfigError(f"flag spelling {spelling} is listed for both {other[0].lever} and {spec.lever}")
        self._by_spelling[spelling] = (spec, positive)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, where: str = "flags") -> FlagTable:
        specs = []
        for lever, raw in (data or {}).items():
            if not isinstance(raw, Mapping) or set(raw) - _SPEC_KEYS or not raw.get("spell"):
                raise ConfigError(f"{where}: key 'flags.{lever}' must be a mapping with spell: [...] "
                                  f"(and negative, words, bare, repeat, env), got {raw!r}")
            spell = tuple(str(s) for s in raw["spell"])
            bad = [s for s in spell + tuple(raw.get("negative") or ()) if not str(s).startswith("-")]
            if bad:
                raise ConfigError(f"{where}: key 'flags.{lever}': spelling {bad[0]!r} must start with - or --")
            words = raw.get("words")
            if words is not None and (not isinstance(words, list) or len(words) != 2):
                raise ConfigError(f"{where}: key 'flags.{lever}.words' must be [true-word, false-word]")
            same = raw.get("same") or {}
            if not isinstance(same, Mapping) or not all(isinstance(v, (bool, int, str)) for v in same.values()):
                raise ConfigError(f"{where}: key 'flags.{lever}.same' must map value texts to the value "
                                  f"they mean ({{'1': true, '-1': auto}}), got {same!r}")
            specs.append(FlagSpec(str(lever), spell, tuple(str(s) for s in raw.get("negative") or ()),
                                  tuple(str(w) for w in words) if words else None,  # type: ignore[arg-type]
                                  bool(raw.get("bare")), bool(raw.get("repeat")), raw.get("env"),
                                  tuple((str(k), v) for k, v in same.items())))
        return cls(specs)

    # -- lookups ---------------------------------------------------------------------------
    def lookup(self, name: str) -> tuple[FlagSpec, bool] | None:
        """(spec, positive) of a spelling (``-ngl``, ``--n_gpu_layers``, ``ngl``, ``nkvo``)."""
        name = name.strip()
        if name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        if name.startswith("-"):
            return self._by_spelling.get(name)
        for dashes in ("--", "-"):
            hit = self._by_spelling.get(dashes + name.replace("_", "-") if dashes == "--" else dashes + name)
            if hit:
                return hit
        return None

    def canonical(self, name: str) -> str:
        """The canonical lever name of any spelling; an unknown name, without its dashes."""
        hit = self.lookup(name)
        return hit[0].lever if hit else name.strip().lstrip("-")

    def env_mapping(self, levers) -> dict[str, str]:
        """lever -> its LLAMA_ARG_* variable, for the levers that have one (an env-file promotion)."""
        out = {}
        for name in levers:
            hit = self.lookup(name)
            if hit and hit[0].env:
                out[hit[0].lever] = hit[0].env
        return out

    def env_lever(self, env_name: str) -> str | None:
        spec = self._by_env.get(env_name)
        return spec.lever if spec else None

    # -- render ----------------------------------------------------------------------------
    def render(self, name: str, value: Any) -> list[str]:
        hit = self.lookup(name)
        if hit is None:
            flag = ("-" if len(name) == 1 else "--") + name
            if isinstance(value, bool):
                return [flag] if value else []
            if isinstance(value, (list, tuple)):
                return [flag, ",".join(format_value(v) for v in value)]
            return [flag, format_value(value)]
        spec, positive = hit
        if not positive and isinstance(value, bool):
            value = not value                  # a lever named by its negative spelling
        return spec.render(value)

    # -- parse -----------------------------------------------------------------------------
    def parse(self, argv: Iterable[str],
              style: str = "llamacpp") -> tuple[str | None, list[tuple[str, Any]], int | None]:
        """An argv (after the entrypoint) -> (model, [(canonical lever, value)], port): the one
        reader of an engine's command line (``arms.argv.parse_argv`` is its door for a style).

        llama.cpp style: every word belongs to a flag (the model to ``-m``); a flag given twice
        keeps its last value, a ``repeat`` flag collects them. vLLM style (an empty table): the
        model may stand first, ``--no-x`` alone is ``x: false``, every flag is kept in order,
        repeats included. Any other style reads as vLLM's without those two."""
        toks = list(argv)
        llama, vllm = style == "llamacpp", style == "vllm"
        model: str | None = toks.pop(0) if vllm and toks and not _is_flag(toks[0]) else None
        port: int | None = None
        args: list[tuple[str, Any]] = []
        place: dict[str, int] = {}               # llama.cpp style: a flag's place in args

        def put(name: str, value: Any, collect: bool = False) -> None:
            if not llama or name not in place:
                place.setdefault(name, len(args))
                args.append((name, value))
                return
            prev = args[place[name]][1]
            if collect:
                value = (list(prev) if isinstance(prev, list) else [prev]) + [value]
            args[place[name]] = (name, value)

        i = 0
        while i < len(toks):
            tok = toks[i]
            if not _is_flag(tok):
                raise ConfigError(f"engine argument {tok!r} stands alone: " + (
                    "every word after the entrypoint belongs to a flag (the model goes after -m)" if llama else
                    "only the model may be positional (first), every other word belongs to a --flag"))
            head, eq, inline = tok.partition("=")
            hit = self.lookup(head)
            i += 1
            if hit is not None and (eq == "" and not hit[0].takes_value or not hit[1]):
                put(hit[0].lever, hit[1])        # a switch, or a negative spelling
                continue
            if eq:
                text: str | None = inline
            elif i < len(toks) and (not _is_flag(toks[i]) or (hit is not None and not hit[0].words)):
                text = toks[i]
                i += 1
            else:
                text = None
            name = hit[0].lever if hit else head.lstrip("-")
            if name in ("model", "m") and text is not None and model is None:
                model = text
                continue
            if name == "port" and text is not None and _INT.match(text):
                port = int(text)
                continue
            if text is None:
                if hit is not None and not hit[0].words:
                    raise ConfigError(f"engine flag {head} needs a value")
                if vllm and name.startswith("no-") and len(name) > 3:
                    put(name[3:], False)
                else:
                    put(name, True)              # 2025 llama.cpp builds: -fa alone meant on
                continue
            spec = hit[0] if hit else None
            if spec is not None and spec.words and text in spec.words:
                value: Any = text == spec.words[0]
            else:
                value = typed(text)
            put(name, value, collect=spec is not None and spec.repeat)
        return model, args, port

    # -- shapes and levers: one value per argv ---------------------------------------------
    def canonical_shape(self, shape: Shape, where: str = "baseline") -> Shape:
        """The shape with every arg under its canonical lever name and value; one flag given
        twice under two spellings (``ngl`` and ``n-gpu-layers``) is a ConfigError. A switch
        set to false (``mlock: false``) is left out, as its argv is."""
        seen: dict[str, str] = {}
        args = []
        for name, value in shape.args:
            lever = self.canonical(name)
            if lever in seen:
                raise ConfigError(f"{where}: args {seen[lever]!r} and {name!r} are the same flag "
                                  f"({lever}); keep one")
            seen[lever] = name
            value = self.canonical_value(name, value)
            if value is not ABSENT:
                args.append((lever, value))
        if args == list(shape.args):
            return shape
        import dataclasses

        return dataclasses.replace(shape, args=tuple(args))

    def canonical_lever(self, lever: Lever) -> Lever:
        """The lever under its canonical name with canonical values; two values that render the
        same argv (``on`` and ``"on"``; ``false`` and ``absent`` of a switch) are a ConfigError
        naming both: the tuner would boot the same engine twice as two shapes."""
        if lever.kind == "env":
            return lever
        name = self.canonical(lever.name)
        values = []
        seen: dict[tuple[str, ...], Any] = {}
        for v in lever.values:
            c = self.canonical_value(lever.name, v)
            argv = () if c is ABSENT else tuple(self.render(name, c))
            if argv in seen:
                raise ConfigError(f"lever {name}: values {_show(seen[argv])} and {_show(v)} both render "
                                  f"{' '.join(argv) if argv else 'no flag'}, one engine twice; keep one")
            seen[argv] = v
            values.append(c)
        if name == lever.name and tuple(values) == lever.values:
            return lever
        return Lever(name, tuple(values), lever.numerics)

    def canonical_value(self, name: str, value: Any) -> Any:
        """A value as the canonical lever holds it, the value ``parse`` reads back from its argv:
        ``no-mmap: true`` is ``mmap: false``, ``flash-attn: "on"`` / ``1`` / ``enabled`` are
        ``flash-attn: true`` (all ``-fa on``), ``threads: "2"`` is ``2``, ``mlock: "yes"`` is
        ``true`` and ``mlock: false`` ABSENT (no flag either way). A value the engine would not
        read (``-fa yes``) stays as written: its boot says so."""
        if value is ABSENT or value is None:
            return ABSENT
        hit = self.lookup(name)
        spec = hit[0] if hit else None
        lever = spec.lever if spec else name.strip().lstrip("-")
        if lever in ("model", "port"):
            return value
        if spec is not None:
            texts = dict(spec.same)
            if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value) in texts:
                value = texts[str(value)]
            if spec.words and isinstance(value, str) and value in spec.words:
                value = value == spec.words[0]
            if spec.switch and isinstance(value, str) and value in _YES | _NO:
                value = value in _YES
            if not hit[1] and isinstance(value, bool):
                value = not value              # named by its negative spelling
        try:
            argv = self.render(lever, value)
            if not argv:
                return ABSENT                  # a switch's false: no flag, as absent
            _, args, _ = self.parse(argv)
        except ConfigError:
            return value
        if len(args) != 1 or args[0][0] != lever or self.render(lever, args[0][1]) != argv:
            return value
        back = args[0][1]
        return tuple(back) if isinstance(back, list) else back


def _show(value: Any) -> str:
    """A lever value as the campaign writes it: strings quoted, so ``"on"`` is not ``true``."""
    return json.dumps(value) if isinstance(value, str) else format_value(value)


@lru_cache(maxsize=8)
def flag_table(profile_name: str) -> FlagTable:
    """The flag table of a shipped profile (empty when it lists no flags)."""
    from arms.profiles import load_profile

    return FlagTable.from_mapping(load_profile(profile_name).flags, profile_name)
