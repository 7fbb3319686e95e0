"""The import rules that keep the rooms apart (docs/ARCHITECTURE.md), read from the code's own imports.

Every ``import`` and ``from ... import`` of the four packages is read with ``ast`` — module-level,
inside functions and under ``TYPE_CHECKING`` alike, relative ones resolved — so a rule broken by a
lazy import inside a function is still broken.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tuner", "arms", "host", "simengine")

# what the morning may not import: anything that writes a campaign folder, a study or a unit
WRITERS = ("tuner.cli", "tuner.daemon", "tuner.night.loop", "tuner.night.arm_runner", "tuner.night.journal",
           "tuner.night.lock", "tuner.night.study", "tuner.night.shared", "tuner.night.simfleet", "tuner.production")
# never in arms/ (it defines the Host protocol; side effects live in host/)
SIDE_EFFECT_LIBS = ("podman", "subprocess", "psutil")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module the file names in an import (``from a import b`` names ``a`` and ``a.b``)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports."""
    files = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    return {m: {i for i in imports_of(p) if i in files and i != m} for m, p in files.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def under(mod: str, prefixes: tuple[str, ...] | str) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def offences(g: dict[str, set[str]], who: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{m} -> {i}" for m, deps in g.items() if under(m, who)
                  for i in deps if under(i, forbidden))


G = graph()


def test_the_graph_is_read():
    """The reader itself: relative imports resolve, lazy imports count, and the rooms exist."""
    assert "tuner.night.loop" in G and "tuner.morning.report" in G and "tuner.production.promote" in G
    assert "tuner.night.compare" in G["tuner.night.judging"]                  # a module-level import
    assert "host.simhost" in G["tuner.daemon"]                                # an import inside a function
    assert imports_of(ROOT / "host" / "simhost.py") >= {"host.fake", "host.simfs"}   # `from .fake import`


def test_no_import_cycles():
    assert cycles(G) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("low, above", [
    ("arms", ("tuner", "host", "simengine")),      # one arm: pure logic, the Host protocol it needs
    ("simengine", ("tuner", "arms", "host")),     # a program of its own (stdlib only)
    ("host", ("tuner",)),                          # the real and simulated hosts serve arms/, not the tuner
])
def test_lower_floors_import_nothing_above_them(low, above):
    assert offences(G, low, above) == []


def test_arms_has_no_side_effect_library():
    bad = sorted(f"{m} imports {lib}" for pkg in ["arms"] for p in (ROOT / pkg).rglob("*.py")
                 for m in [module_name(p)] for i in imports_of(p) for lib in SIDE_EFFECT_LIBS if under(i, lib))
    assert bad == []


def test_the_morning_reads_and_never_writes():
    """status, report, export, dashboard, live view: readers import no writer."""
    assert offences(G, "tuner.morning", WRITERS) == []


@pytest.mark.parametrize("room, forbidden", [
    ("tuner.night", ("tuner.morning", "tuner.production", "tuner.cli", "tuner.daemon", "tuner.oneshot")),
    ("tuner.production", ("tuner.morning", "tuner.cli", "tuner.daemon", "tuner.oneshot")),
    ("tuner.morning", ("tuner.cli", "tuner.oneshot")),
])
def test_rooms_import_downwards_only(room, forbidden):
    """The night knows nothing of the morning or of production; production reads the night's
    journal and state, never the morning's views; only the CLI stands on top of everything."""
    assert offences(G, room, forbidden) == []
