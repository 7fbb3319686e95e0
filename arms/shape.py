"""Shape, Lever and Change: the frozen values one arm is made of.

A ``Shape`` is everything that decides one boot; a ``Lever`` is one flag or env var a
campaign may change; ``Shape.with_change`` makes an arm's shape from the incumbent, and
``Shape.diff`` says in words what differs.

Identity: two shapes are equal (and share ``key()``) when their canonical JSON is equal.
The order of ``args`` does not count (the engine parses named options, and one config
reached by two paths must dedupe), nor does the key order of a dict value, nor ``2.0``
against ``2`` (an integral float is stored as an int); but ``true`` and ``1`` differ,
because they render differently (``--flag`` against ``--flag 1``).

Values are stored frozen: a dict becomes a ``FrozenDict`` (insertion order kept for
rendering), a list becomes a tuple. ``thaw`` turns them back into JSON data.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from arms.errors import ConfigError

__all__ = [
    "ABSENT", "Change", "FrozenDict", "Lever", "Mount", "Shape", "canonical_json",
    "format_value", "freeze", "lever_name", "parse_change", "thaw",
]

COMPILE_CACHE_TARGET = "/root/.cache"
NUMERICS = ("preserving", "changing")
_DIGEST = re.compile(r"[^@\s]+@sha256:[0-9a-f]{64}\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FLAG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


class _Absent(enum.Enum):
    """The lever value that removes a flag or env var (a singleton that survives pickling)."""

    ABSENT = "absent"

    def __repr__(self) -> str:
        return "ABSENT"

    def __str__(self) -> str:
        return "absent"


ABSENT = _Absent.ABSENT


def _is_absent(value: object) -> bool:
    return value is ABSENT or value is None or (isinstance(value, str) and value == "absent")


class FrozenDict(Mapping):
    """A read-only, hashable mapping; equal to any mapping with the same canonical JSON."""

    __slots__ = ("_d",)

    def __init__(self, items: Any = ()) -> None:
        object.__setattr__(self, "_d", dict(items))

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenDict is read-only")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and _same(self, other)

    def __hash__(self) -> int:
        return hash(canonical_json(self))

    def __repr__(self) -> str:
        return f"FrozenDict({self._d!r})"

    def __reduce__(self) -> tuple:
        return (FrozenDict, (tuple(self._d.items()),))


def freeze(value: Any, where: str = "value") -> Any:
    """JSON data -> hashable form (dict -> FrozenDict, list -> tuple); ConfigError otherwise."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: {value!r} is not a finite number")
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return int(value)  # 2.0 boots exactly like 2 (and an int flag refuses "2.0")
    if value is ABSENT or value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{where}: mapping keys must be strings, got {list(value)!r}")
        return FrozenDict((k, freeze(v, where)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v, where) for v in value)
    raise ConfigError(f"{where}: {value!r} ({type(value).__name__}) is not JSON-able; "
                      "use a string, number, bool, list or mapping")


def thaw(value: Any) -> Any:
    """The inverse of ``freeze``: plain JSON data (ABSENT has none)."""
    if value is ABSENT:
        raise ConfigError("ABSENT has no JSON form")
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    return json.dumps(thaw(freeze(value)), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)


def _same(a: Any, b: Any) -> bool:
    if a is ABSENT or b is ABSENT:
        return a is b
    try:
        return canonical_json(a) == canonical_json(b)
    except ConfigError:
        return False


def format_value(value: Any) -> str:
    """One value as text: absent, true/false, numbers as written, compact JSON (key order
    kept). An integral float loses its ".0" (``freeze`` stores it as an int)."""
    if value is ABSENT:
        return "absent"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)
    if isinstance(value, (int, str)):
        return str(value)
    return json.dumps(thaw(value), separators=(",", ":"), sort_keys=False, ensure_ascii=False)


def _env_string(value: Any) -> str:
    # vLLM reads most boolean env vars as bool(int(...)), so a YAML true becomes "1".
    if isinstance(value, bool):
        return "1" if value else "0"
    return format_value(value)


def _flag_name(raw: Any) -> str:
    name = str(raw).strip().lstrip("-")
    head, dot, tail = name.partition(".")   # dotted sub-keys (-cc.mode) keep their spelling
    name = head.replace("_", "-") + dot + tail
    if not _FLAG_NAME.match(name):
        raise ConfigError(f"flag name {raw!r} is not valid; write it like max-num-seqs")
    return name


def _env_name(raw: Any) -> str:
    name = str(raw).strip()
    if not _ENV_NAME.match(name):
        raise ConfigError(f"env var name {raw!r} is not valid; use letters, digits and _")
    return name


def lever_name(raw: Any) -> str:
    """Canonical lever name: ``max-num-seqs`` for a flag, ``env.NAME`` for an env var."""
    text = str(raw).strip()
    if text.startswith("env."):
        return "env." + _env_name(text[4:])
    return _flag_name(text)


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False
    kind: str = "bind"

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source or not isinstance(
                self.target, str) or not self.target.startswith("/"):
            raise ConfigError(f"mount {self.source!r} -> {self.target!r}: give a source and "
                              "an absolute target")
        if not isinstance(self.read_only, bool) or self.kind not in ("bind", "volume"):
            raise ConfigError(f"mount {self.target}: read_only must be true/false and kind "
                              f"bind or volume, got {self.read_only!r}, {self.kind!r}")

    def spec(self) -> str:
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def parse(cls, value: Any, default_target: str = "") -> Mount:
        """``"src:dst[:ro|:rw]"``, a bare path (with default_target) or a mapping."""
        if isinstance(value, Mount):
            return value
        if isinstance(value, Mapping) and set(value) <= {"source", "target", "read_only", "kind"}:
            return cls(value.get("source", ""), value.get("target", default_target),
                       value.get("read_only", False), value.get("kind", "bind"))
        parts = value.split(":") if isinstance(value, str) else []
        if len(parts) == 1 and default_target:
            return cls(value, default_target)
        if len(parts) == 2 or (len(parts) == 3 and parts[2] in ("ro", "rw")):
            return cls(parts[0], parts[1], parts[2:] == ["ro"])
        raise ConfigError(f"mount {value!r} is not valid; write SOURCE:TARGET[:ro] or a "
                          "mapping of source, target, read_only, kind")


def _named(pairs: Any, what: str, name_of: Any, value_of: Any) -> list[tuple[str, Any]]:
    """Normalise (name, value) pairs from a mapping or a sequence; refuse absent and twins."""
    if isinstance(pairs, Mapping):
        pairs = pairs.items()
    out: dict[str, Any] = {}
    for item in pairs or ():
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ConfigError(f"{what} must be a mapping of name: value, got {item!r}")
        name = name_of(item[0])
        if _is_absent(item[1]):
            raise ConfigError(f"{what} {name!r} is absent; leave it out")
        if name in out:
            raise ConfigError(f"{what} {name!r} is given twice; keep one")
        out[name] = value_of(freeze(item[1], f"{what} {name!r}"))
    return list(out.items())


@dataclass(frozen=True, eq=False)
class Shape:
    """Everything that decides one boot. Construction normalises: args keep their order;
    env, options, devices and mounts (by target) are sorted; values are frozen."""

    image: str
    model: str
    args: tuple[tuple[str, Any], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[Mount, ...] = ()
    devices: tuple[str, ...] = ()
    port: int = 8000
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        for name in ("image", "model"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"shape {name} {getattr(self, name)!r} must be a non-empty string")
        if isinstance(self.port, bool) or not isinstance(self.port, int) \
                or not 0 < self.port < 65536:
            raise ConfigError(f"port {self.port!r} must be an integer in 1..65535")
        if any(not isinstance(d, str) or not d for d in self.devices):
            raise ConfigError(f"devices {self.devices!r} must be non-empty strings")
        mounts = sorted((Mount.parse(m) for m in self.mounts), key=lambda m: m.target)
        targets = [m.target for m in mounts]
        if len(set(targets)) != len(targets):
            raise ConfigError(f"mount targets {targets} repeat; mount each target once")
        option_name = lambda raw: str(raw).strip().lstrip("-").replace("-", "_")  # noqa: E731
        normal = {
            "args": tuple(_named(self.args, "arg", _flag_name, lambda v: v)),
            "env": tuple(sorted(_named(self.env, "env", _env_name, _env_string))),
            "options": tuple(sorted(_named(self.options, "option", option_name, lambda v: v),
                                    key=lambda p: p[0])),
            "mounts": tuple(mounts),
            "devices": tuple(sorted(set(self.devices))),
        }
        for name, value in normal.items():
            object.__setattr__(self, name, value)
        canon = self.to_dict()
        canon["args"] = sorted(canon["args"], key=lambda p: p[0])
        object.__setattr__(self, "_canon", json.dumps(
            canon, sort_keys=True, separators=(",", ":"), ensure_ascii=False))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Shape):
            return NotImplemented
        return self._canon == other._canon  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._canon)  # type: ignore[attr-defined]

    def key(self) -> str:
        """12 hex characters, stable across runs and Python versions."""
        return hashlib.sha256(self._canon.encode()).hexdigest()[:12]  # type: ignore

    def validate_image(self) -> None:
        if not _DIGEST.match(self.image):
            raise ConfigError(f"image {self.image!r} is not pinned by digest "
                              "(name@sha256:<64 hex>): resolve it with `tuner check`, "
                              "which records the digest")

    def value_of(self, lever: Lever | str) -> Any:
        """The shape's current value of a lever, or ABSENT."""
        name = lever_name(getattr(lever, "name", lever))
        pairs = self.env if name.startswith("env.") else self.args
        return dict(pairs).get(name[4:] if name.startswith("env.") else name, ABSENT)

    def with_change(self, lever: Lever | str, value: Any) -> Shape:
        """A new shape with one flag or env var set (in place, or appended) or removed."""
        name = lever_name(getattr(lever, "name", lever))
        if not _is_absent(value):
            value = freeze(value, f"lever {name!r}")
        if name.startswith("env."):
            env = [(n, v) for n, v in self.env if n != name[4:]]
            if not _is_absent(value):
                env.append((name[4:], _env_string(value)))
            return dataclasses.replace(self, env=tuple(env))
        args = [(n, value if n == name else v) for n, v in self.args
                if not (n == name and _is_absent(value))]
        if not _is_absent(value) and name not in dict(args):
            args.append((name, value))
        return dataclasses.replace(self, args=tuple(args))

    def diff(self, other: Shape) -> tuple[Change, ...]:
        """What changes from self to other, in a stable order."""
        out: list[Change] = []

        def add(prefix: str, mine: Mapping, theirs: Mapping, order: list | None = None) -> None:
            for name in order or sorted(set(mine) | set(theirs)):
                before, after = mine.get(name, ABSENT), theirs.get(name, ABSENT)
                if not _same(before, after):
                    out.append(Change(prefix + name, before, after))

        add("", {"image": self.image, "model": self.model},
            {"image": other.image, "model": other.model}, ["image", "model"])
        mine, theirs = dict(self.args), dict(other.args)
        add("", mine, theirs, list(mine) + [n for n in theirs if n not in mine])
        add("env.", dict(self.env), dict(other.env))
        add("mount:", {m.target: m.spec() for m in self.mounts},
            {m.target: m.spec() for m in other.mounts})
        add("", {"devices": self.devices, "port": self.port},
            {"devices": other.devices, "port": other.port}, ["devices", "port"])
        add("option:", dict(self.options), dict(other.options))
        return tuple(out)

    def to_dict(self) -> dict:
        """JSON data for the journal; ``from_dict`` gives back an equal shape."""
        return {
            "image": self.image,
            "model": self.model,
            "args": [[n, thaw(v)] for n, v in self.args],
            "env": dict(self.env),
            "mounts": [m.to_dict() for m in self.mounts],
            "devices": list(self.devices),
            "port": self.port,
            "options": {n: thaw(v) for n, v in self.options},
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> Shape:
        expected = {"image", "model", "args", "env", "mounts", "devices", "port", "options"}
        if set(d) != expected:
            raise ConfigError(f"journaled shape has keys {sorted(d)}; expected {sorted(expected)}")
        return cls(d["image"], d["model"], tuple((n, v) for n, v in d["args"]),
                   tuple(d["env"].items()), tuple(Mount.parse(m) for m in d["mounts"]),
                   tuple(d["devices"]), d["port"], tuple(d["options"].items()))

    @classmethod
    def from_mapping(cls, d: Mapping) -> Shape:
        """The YAML form an operator writes (see examples/operator-campaign-sketch.yaml)."""
        allowed = ("image", "model", "args", "env", "mounts", "compile_cache", "devices",
                   "port", "options")
        if not isinstance(d, Mapping):
            raise ConfigError(f"shape must be a mapping with keys {', '.join(allowed)}")
        unknown = [k for k in d if k not in allowed]
        if unknown:
            raise ConfigError(f"unknown shape key {unknown[0]!r}; expected one of "
                              f"{', '.join(allowed)}")
        for k in ("image", "model"):
            if not d.get(k):
                raise ConfigError(f"shape needs {k!r}")

        def keep(what: str) -> tuple:
            if not isinstance(d.get(what) or {}, Mapping):
                raise ConfigError(f"shape {what} must be a mapping of name: value")
            return tuple((k, v) for k, v in (d.get(what) or {}).items() if not _is_absent(v))

        mounts = [Mount.parse(m) for m in d.get("mounts") or ()]
        if d.get("compile_cache"):
            mounts.append(Mount.parse(d["compile_cache"], default_target=COMPILE_CACHE_TARGET))
        devices = d.get("devices") or ()
        return cls(image=str(d["image"]), model=str(d["model"]), args=keep("args"),
                   env=keep("env"), mounts=tuple(mounts),
                   devices=(devices,) if isinstance(devices, str) else tuple(devices),
                   port=d.get("port", 8000), options=keep("options"))


@dataclass(frozen=True)
class Change:
    """One difference between two shapes; ``before``/``after`` are ABSENT when missing."""

    name: str
    before: Any
    after: Any

    def describe(self) -> str:
        return f"{self.name} {format_value(self.before)} → {format_value(self.after)}"

    def to_dict(self) -> dict:
        """JSON data; a missing ``before``/``after`` key means ABSENT."""
        out: dict = {"name": self.name}
        for side in ("before", "after"):
            if getattr(self, side) is not ABSENT:
                out[side] = thaw(getattr(self, side))
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> Change:
        return cls(d["name"], freeze(d.get("before", ABSENT)), freeze(d.get("after", ABSENT)))


@dataclass(frozen=True)
class Lever:
    """One flag (``max-num-seqs``) or env var (``env.NAME``) and its candidate values."""

    name: str
    values: tuple
    numerics: str = "preserving"

    def __post_init__(self) -> None:
        name = lever_name(self.name)
        object.__setattr__(self, "name", name)
        if isinstance(self.values, (str, bytes, Mapping)) or not hasattr(self.values, "__iter__"):
            raise ConfigError(f"lever {name!r}: values must be a list, got {self.values!r}")
        values = tuple(ABSENT if _is_absent(v) else freeze(v, f"lever {name!r}")
                       for v in self.values)
        if not values:
            raise ConfigError(f"lever {name!r} has no values; give at least one")
        tags = ["absent" if v is ABSENT else canonical_json(v) for v in values]
        for i, v in enumerate(values):
            if tags[i] in tags[:i]:
                raise ConfigError(f"lever {name!r} lists the value {format_value(v)} twice")
        if self.numerics not in NUMERICS:
            raise ConfigError(f"lever {name!r}: numerics {self.numerics!r} must be "
                              "preserving or changing")
        object.__setattr__(self, "values", values)

    @property
    def kind(self) -> str:
        return "env" if self.name.startswith("env.") else "flag"

    @property
    def target(self) -> str:
        return self.name[4:] if self.kind == "env" else self.name

    @classmethod
    def from_spec(cls, name: str, spec: Any) -> Lever:
        """``[v1, v2]`` or ``{values: [v1, v2], numerics: preserving|changing}``."""
        if isinstance(spec, Mapping):
            extra = set(spec) - {"values", "numerics"}
            if extra:
                raise ConfigError(f"lever {name!r}: unknown keys {sorted(extra)}; "
                                  "use values and numerics")
            if "values" not in spec:
                raise ConfigError(f"lever {name!r} needs values: [...]")
            return cls(name, spec["values"], spec.get("numerics", "preserving"))
        return cls(name, spec)


def _type_tag(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "int" if isinstance(value, int) else "float"
    if isinstance(value, str):
        return "string"
    return "mapping" if isinstance(value, Mapping) else "list"


def parse_change(text: str, levers: Mapping[str, Lever] | None = None) -> tuple[str, Any]:
    """``LEVER=VALUE`` from the CLI -> (lever name, frozen value or ABSENT)."""
    raw_name, eq, raw_value = text.partition("=")
    if not eq or not raw_name.strip() or not raw_value.strip():
        raise ConfigError(f"--change {text!r} is not LEVER=VALUE; e.g. --change max-num-seqs=8")
    name = lever_name(raw_name)
    try:
        value = yaml.safe_load(raw_value)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(f"--change {text!r}: value is not YAML ({first})") from None
    value = ABSENT if _is_absent(value) else freeze(value, f"--change {name}")
    if levers is None:
        return name, value
    known = {lever_name(k): lv for k, lv in levers.items()}
    if name not in known:
        raise ConfigError(f"--change: unknown lever {name!r}; known levers: "
                          f"{', '.join(sorted(known))}")
    if value is ABSENT:
        return name, value
    tags = {_type_tag(v) for v in known[name].values if v is not ABSENT}
    tag = _type_tag(value)
    if tags and tag not in tags and not (tag == "int" and "float" in tags):
        raise ConfigError(f"--change {name}={raw_value.strip()}: expected a "
                          f"{' or '.join(sorted(tags))} like the lever's other values, "
                          f"got a {tag}")
    return name, value
