"""The admin plane's route tables: each route's path pattern split into segments and kept in a
segment trie, so a request looks at the few routes its path could reach, not at every route in turn.

A pattern is written as a regular expression of a restricted shape: ``/``-separated segments, each
either static text (plain characters, or punctuation escaped with a backslash: ``export\\.csv``)
or a whole-segment parameter ``(?P<name>[^/]+)``; a route also answers its path with one trailing
slash (the pattern followed by ``/?\\Z``). :meth:`PathTable.add` refuses anything else, so every
pattern means what that regular expression, matched from the start of the path, means.

:meth:`PathTable.lookup` answers what a scan of the patterns in the order they were added would:
the first route for the method whose pattern matches the path, with the parameters it captured,
and whether a route for any method matches the path (a 405 rather than a 404).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

_PARAMETER = re.compile(r"\(\?P<(\w+)>\[\^/\]\+\)")
# Static text: characters a regular expression takes literally, or escaped punctuation.
_STATIC = re.compile(r"(?:[^\\.^$*+?{}\[\]|()/\0]|\\[^\w\s/\0])*")
_UNESCAPE = re.compile(r"\\(.)")
# Stands for a parameter while a pattern is split into segments (no pattern holds it).
_HOLE = "\0"


@dataclass(frozen=True, slots=True)
class Row(Generic[T]):
    """One route: as added, and what the table made of it."""

    method: str
    pattern: str
    value: T
    # The parameters' names, in the order they appear in the path.
    names: tuple[str, ...]
    # The path as the scope table spells it: ``/admin/users/{id}``.
    template: str
    # Its place in the order routes were added (the first one added wins).
    index: int


class _Node(Generic[T]):
    __slots__ = ("param", "rows", "static")

    def __init__(self) -> None:
        self.static: dict[str, _Node[T]] = {}
        self.param: _Node[T] | None = None
        # The routes whose pattern ends here, in the order they were added.
        self.rows: list[Row[T]] = []


def _segments(pattern: str) -> tuple[list[str | None], tuple[str, ...]]:
    """A pattern's segments (static text, or None for a parameter) and its parameters' names."""
    if _HOLE in pattern:
        raise ValueError(f"route pattern {pattern!r}: a NUL character")
    names = tuple(_PARAMETER.findall(pattern))
    segments: list[str | None] = []
    for text in _PARAMETER.sub(_HOLE, pattern).split("/"):
        if text == _HOLE:
            segments.append(None)
        elif _STATIC.fullmatch(text):
            segments.append(_UNESCAPE.sub(r"\1", text))
        else:
            raise ValueError(f"route pattern {pattern!r}: segment {text!r} is neither static text nor a parameter")
    if len(segments) < 2 or segments[-1] == "":
        # A pattern ending in "/" (or empty) would not take its trailing slash as the others do.
        raise ValueError(f"route pattern {pattern!r}: ends with a slash")
    if len(set(names)) != len(names):
        raise ValueError(f"route pattern {pattern!r}: a parameter named twice")
    return segments, names


class PathTable(Generic[T]):
    """Routes by method and path pattern (see the module's docs)."""

    def __init__(self) -> None:
        self.rows: list[Row[T]] = []
        self._root: _Node[T] = _Node()

    def add(self, method: str, pattern: str, value: T) -> Row[T]:
        segments, names = _segments(pattern)
        node = self._root
        for segment in segments:
            if segment is None:
                if node.param is None:
                    node.param = _Node()
                node = node.param
            else:
                node = node.static.setdefault(segment, _Node())
        names_left = iter(names)
        template = "/".join("{" + next(names_left) + "}" if s is None else s for s in segments)
        row = Row(method, pattern, value, names, template, len(self.rows))
        node.rows.append(row)
        self.rows.append(row)
        return row

    def lookup(self, method: str, path: str) -> tuple[Row[T] | None, dict[str, str], bool]:
        """The first route added for ``method`` whose pattern matches ``path``, and its parameters
        (None and {} when none does); and whether a route for any method matches the path."""
        # A match of a pattern never ends in "/" (its last segment is text or a non-empty
        # parameter), so the one trailing slash a route takes is the path's last character.
        if path.endswith("/"):
            path = path[:-1]
        frontier: list[tuple[_Node[T], tuple[str, ...]]] = [(self._root, ())]
        for part in path.split("/"):
            reached: list[tuple[_Node[T], tuple[str, ...]]] = []
            for node, values in frontier:
                child = node.static.get(part)
                if child is not None:
                    reached.append((child, values))
                if node.param is not None and part:
                    reached.append((node.param, (*values, part)))
            if not reached:
                return None, {}, False
            frontier = reached
        best: tuple[Row[T], tuple[str, ...]] | None = None
        known = False
        for node, values in frontier:
            for row in node.rows:
                known = True
                if row.method == method:
                    if best is None or row.index < best[0].index:
                        best = (row, values)
                    break  # the node's later rows were added after this one
        if best is None:
            return None, {}, known
        row, values = best
        return row, dict(zip(row.names, values, strict=True)), True
