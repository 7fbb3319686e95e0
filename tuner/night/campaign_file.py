"""Reading a campaign file: limits first, then YAML, and the line of every key.

A campaign is a few kilobytes of UTF-8 YAML, a few levels deep. What is not refused here,
before any YAML is built, each with ``FILE:LINE: KEY: ...``:

- a file over ``MAX_BYTES`` (1 MB; 1,000,000 bytes): refused from its size, before it is read
  (a 50 MB file once took 22 s and 287 MB to check, and every journal copies the campaign);
- bytes that are not UTF-8: the line and key of the first one;
- nesting deeper than ``MAX_DEPTH`` (32 levels; a campaign needs five): the key where it starts,
  found from the parser's event stream, stopped at the limit (no recursion, no full parse);
- aliases that expand past ``MAX_NODES`` values (billion laughs): the top-level key that holds them;
- a key given twice in one mapping (PyYAML would keep the last silently).

``Lines`` maps each key path to its line, from the composed node tree (nothing constructed).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from arms.errors import ConfigError

MAX_BYTES = 1_000_000       # a campaign is a few KB; the journal keeps a copy of it
MAX_DEPTH = 32              # campaign -> baseline -> args -> a JSON value: five or six levels
MAX_NODES = 20_000          # a campaign is a few hundred YAML nodes; aliases expanding past this are refused


def key_text(path: tuple) -> str:
    """A key path as the errors write it: ``baseline.env.NAME``; a key that is empty or holds
    a space, a quote or a colon is quoted (``baseline.env."MY VAR"``), so the error says which one."""
    out = []
    for part in path:
        text = str(part)
        out.append(text if text and not any(c in text for c in ' "\t:') else '"' + text.replace('"', '\\"') + '"')
    return ".".join(out)


class Lines:
    """YAML line of each key path, from the composed node tree (no construction)."""

    def __init__(self, root: yaml.Node | None):
        self.at: dict[tuple, int] = {(): 1}
        if root is not None:
            self._walk(root, (), set())

    def _walk(self, node, path: tuple, active: set) -> None:
        if id(node) in active:
            return
        active = active | {id(node)}
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = (*path, k.value if isinstance(k, yaml.ScalarNode) else str(k.start_mark.line))
                self.at.setdefault(key, k.start_mark.line + 1)
                self._walk(v, key, active)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                self.at.setdefault((*path, i), v.start_mark.line + 1)
                self._walk(v, (*path, i), active)

    def line(self, loc: tuple) -> tuple[int, tuple]:
        """(line, the part of ``loc`` that names a key in the file)."""
        path: tuple = ()
        for part in loc:
            key = (*path, part)
            if key in self.at:
                path = key
            elif isinstance(part, str) and (*path, _int(part)) in self.at:
                path = (*path, _int(part))
        return self.at.get(path, 1), path

    def key_at(self, line: int) -> tuple:
        """The deepest key path that starts on ``line`` or, failing that, the last one before it."""
        best: tuple = ()
        for path, at in self.at.items():
            if at <= line and (self.at.get(best, 0) < at or (self.at.get(best, 0) == at and len(path) > len(best))):
                best = path
        return best


def _int(text: str):
    return int(text) if text.isdigit() else text


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for knode, _ in node.value:
            key = self.construct_object(knode, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' is given twice (first on line {seen[key] + 1}); keep one",
                    knode.start_mark)
            seen[key] = knode.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _where(path: Path, line: int, key: tuple) -> str:
    return f"{path}:{line}: {key_text(key) or '(file)'}"


def _read_text(path: Path) -> str:
    try:
        size = path.stat().st_size
        if path.is_file() and size > MAX_BYTES:
            raise ConfigError(f"{path}:1: (file): {size:,} bytes, over the {MAX_BYTES:,}-byte limit of a campaign "
                              "file (a campaign is a few KB of YAML); keep data out of it and point at files instead")
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)              # a FIFO or a device grows no faster than this
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; give a campaign YAML file (or, where a command takes one, "
                          "the campaign's folder journal/NAME)") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder; give a campaign YAML file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the campaign file: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{path}:1: (file): over the {MAX_BYTES:,}-byte limit of a campaign file "
                          "(a campaign is a few KB of YAML)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        text = data.decode("utf-8", errors="replace")
        try:
            key = Lines(yaml.compose(text, Loader=yaml.SafeLoader)).key_at(line)
        except (yaml.YAMLError, RecursionError):
            key = ()
        raise ConfigError(f"{_where(path, line, key)}: byte 0x{data[e.start]:02x} at column {col} is not UTF-8 "
                          "text; save the file as UTF-8 (or write the value in ASCII)") from None


def _refuse_deep(path: Path, text: str) -> None:
    """Nesting past MAX_DEPTH: refused from the event stream, stopped at the limit."""
    stack: list[list] = []            # [kind, expecting a key?, the key or item index]
    try:
        for ev in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                stack.pop()
                if stack and stack[-1][0] == "map":
                    stack[-1][1] = True
                continue
            opens = isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent))
            if not (opens or isinstance(ev, (yaml.ScalarEvent, yaml.AliasEvent))):
                continue
            top = stack[-1] if stack else None
            if top is not None and top[0] == "map" and top[1]:          # a key
                top[2], top[1] = (ev.value if isinstance(ev, yaml.ScalarEvent) else "?"), False
                if not opens:
                    continue
            elif top is not None and top[0] == "seq":
                top[2] += 1
            if not opens:
                if top is not None and top[0] == "map":
                    top[1] = True
                continue
            if len(stack) >= MAX_DEPTH:
                key = tuple(s[2] for s in stack if s[2] is not None and s[2] != -1)
                named = [i for i, k in enumerate(key) if isinstance(k, str)]
                key = key[:min(4, named[-1] + 1 if named else 1)]      # where it starts, not 32 levels of it
                raise ConfigError(f"{_where(path, ev.start_mark.line + 1, key)}: nested more than {MAX_DEPTH} "
                                  "levels deep (a campaign needs about five); flatten it")
            stack.append(["map", True, None] if isinstance(ev, yaml.MappingStartEvent) else ["seq", False, -1])
    except yaml.YAMLError:
        return                            # the full parse below says where, with its own message


def _expanded_size(node, memo: dict, depth: int = 0) -> int:
    """Values ``node`` expands to with its aliases followed; stops counting past MAX_NODES."""
    if id(node) in memo:
        return memo[id(node)]
    if depth > MAX_DEPTH + 2:
        return MAX_NODES + 1
    memo[id(node)] = MAX_NODES + 1           # a node reached again while open: a cycle
    if isinstance(node, yaml.MappingNode):
        n = 1 + sum(_expanded_size(k, memo, depth + 1) + _expanded_size(v, memo, depth + 1) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        n = 1 + sum(_expanded_size(v, memo, depth + 1) for v in node.value)
    else:
        n = 1
    memo[id(node)] = n = min(n, MAX_NODES + 1)
    return n


def _refuse_bomb(path: Path, root: yaml.Node) -> None:
    memo: dict = {}
    if _expanded_size(root, memo) <= MAX_NODES:
        return
    where = (1, ())
    if isinstance(root, yaml.MappingNode):
        sizes = [(_expanded_size(v, memo), k) for k, v in root.value]
        biggest = max(sizes, key=lambda s: s[0])[1]
        where = (biggest.start_mark.line + 1, (biggest.value if isinstance(biggest, yaml.ScalarNode) else "?",))
    raise ConfigError(f"{_where(path, *where)}: its YAML aliases expand to more than {MAX_NODES:,} values; "
                      "a campaign needs no alias bombs — write the values out")


def read_yaml(path: str | os.PathLike) -> tuple[Any, Lines]:
    """The campaign's data and its key lines; ConfigError (one line) for a file that is too big,
    not UTF-8, too deep, an alias bomb, not YAML, or holds a key twice."""
    path = Path(path)
    text = _read_text(path)
    _refuse_deep(path, text)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None:
            _refuse_bomb(path, node)
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
    except RecursionError:
        raise ConfigError(f"{path}:1: (file): YAML nested too deeply") from None
    return raw, Lines(node)
