"""The core's modules are layered: no module reaches, through the `crate::` paths of its non-test
code, back to itself. A cycle (two modules each needing the other) is how a layer stops being one,
so it fails here when it is introduced rather than in a review.

A module is a top-level file or directory of `core/src` (`prepare/decide.rs` belongs to `prepare`);
`lib.rs` and `bindings.rs`, the crate root and the Python bindings, sit above everything and are
left out. Test code (from `#[cfg(test)]` on) and comments are not read.
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "core" / "src"
ROOTS = {"lib", "bindings"}
_PATH = re.compile(r"crate::([a-z_0-9]+)")


def _module(path: Path, src: Path) -> str:
    return path.relative_to(src).parts[0].removesuffix(".rs")


def _code(text: str) -> str:
    cut = text.find("#[cfg(test)]")
    if cut >= 0:
        text = text[:cut]
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def dependencies(src: Path = SRC) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in src.rglob("*.rs"):
        name = _module(path, src)
        if name in ROOTS:
            continue
        uses = graph.setdefault(name, set())
        uses.update(d for d in _PATH.findall(_code(path.read_text())) if d != name and d not in ROOTS)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_cores_modules_have_no_cycle() -> None:
    graph = dependencies()
    # The scan reads real modules: the layers it must see are there.
    assert {"snapshot", "rules", "ruleset", "govern", "exchange", "translate"} <= graph.keys()
    assert "ruleset" in graph["snapshot"] and "snapshot" in graph["rules"]
    assert cycles(graph) == [], cycles(graph)
