"""The admin plane's route tables (meshfast/admin/paths.py) against the obvious way to route: every
registered pattern compiled as a regular expression (pattern + ``/?\\Z``) and tried in the order the
routes were added. For every registered route and for generated paths (near misses, trailing
slashes, extra and missing segments, odd characters, percent-encodings) both must pick the same
route with the same parameters, and agree on whether any route takes the path (405 rather than
404). In process: the routers are built on stand-ins and nothing is called."""

from __future__ import annotations

import itertools
import re
from typing import Any
from unittest.mock import MagicMock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshfast.admin.paths import PathTable, Row
from meshfast.admin.plane import AdminPlane
from meshfast.admin.routes import AdminRouter
from meshfast.admin.scope import PLATFORM_ONLY, ROUTES

METHODS = ("GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS", "get")
ODD = ("", ".", "..", "%2F", "%2e%2e", "a%20b", "a b", "a.b", "x\n", "\n", "é", "?", "#", "*", "(", "\\", "\0",
       "users", "dry-run", "admin", "export.csv", "exportXcsv", "export", "csv", "00000000-0000-0000-0000-000000000000")


def _tables() -> dict[str, PathTable[Any]]:
    router = AdminRouter(MagicMock(), MagicMock(), MagicMock())
    plane = AdminPlane(MagicMock(), router, lambda token: token, MagicMock())
    return {"public": plane._public, "plane": plane._routes, "router": router._routes}


TABLES = _tables()
ROWS = [row for table in TABLES.values() for row in table.rows]


def linear(rows: list[Row[Any]], method: str, path: str) -> tuple[Row[Any] | None, dict[str, str], bool]:
    """The reference: the first route for the method whose regular expression matches, in order."""
    known = False
    for row in rows:
        match = re.compile(row.pattern + r"/?\Z").match(path)
        if match is None:
            continue
        known = True
        if row.method == method:
            return row, match.groupdict(), True
    return None, {}, known


def _agree(path: str) -> None:
    for name, table in TABLES.items():
        for method in METHODS:
            expected = linear(table.rows, method, path)
            assert table.lookup(method, path) == expected, (name, method, path)


def _concrete(row: Row[Any], value: str) -> str:
    return re.sub(r"\{\w+\}", lambda _: value, row.template)


def _paths() -> list[str]:
    """Every route's own path and its near misses."""
    paths = {"", "/", "/admin", "/admin/", "admin/users", "//admin/users", "/admin//users", "/Admin/users",
             "/admin/users/", "/admin/users//", "/admin/users///", "/admin/login", "/admin/logs/export/csv",
             "/admin/logs/exportXcsv", "/admin/logs/export.csv/", "/admin/logs/export%2Ecsv"}
    for row in ROWS:
        for value in ("x", "7f0c2c1e-52f4-4a51-8a1f-3d0e0c1a9b11", *ODD):
            path = _concrete(row, value)
            paths |= {path, path + "/", path + "//", path + "/extra", path + "/extra/", path + "%2F",
                      path.rsplit("/", 1)[0], path.upper(), path.replace("-", "_"), path.replace(".", "X"),
                      path[:-1], path + "x", path.replace("/admin/", "/admin//"), " " + path, path + "\n"}
    return sorted(paths)


def test_the_templates_are_the_patterns_with_named_parameters() -> None:
    """The scope table is keyed by these: what the routers used to derive from each pattern."""
    for row in ROWS:
        old = re.sub(r"\(\?P<(\w+)>\[\^/\]\+\)", r"{\1}", row.pattern).replace("\\.", ".")
        assert row.template == old and row.names == tuple(re.compile(row.pattern).groupindex), row.pattern
    templates = {(row.method, row.template) for row in ROWS}
    assert set(ROUTES) - {("POST", "/admin/login")} <= templates and PLATFORM_ONLY <= templates


def test_every_route_and_its_near_misses_route_as_the_linear_scan_does() -> None:
    paths = _paths()
    assert len(paths) > 3000
    for path in paths:
        _agree(path)


def test_overlapping_routes_keep_their_winner() -> None:
    """The one overlap: POST /admin/rules/dry-run, and /admin/rules/{id} for the other methods."""
    router = TABLES["router"]
    row, params, _ = router.lookup("POST", "/admin/rules/dry-run/")
    assert row is not None and (row.template, params) == ("/admin/rules/dry-run", {})
    row, params, _ = router.lookup("GET", "/admin/rules/dry-run")
    assert row is not None and (row.template, params) == ("/admin/rules/{id}", {"id": "dry-run"})
    assert router.lookup("PATCH", "/admin/rules/dry-run") == (None, {}, True)  # a 405
    assert router.lookup("GET", "/admin/rules/dry-run/x") == (None, {}, False)  # a 404


OVERLAPPING = [("GET", r"/a/(?P<x>[^/]+)/c"), ("GET", r"/a/b/(?P<y>[^/]+)"), ("GET", r"/a/b/c"),
               ("POST", r"/a/(?P<z>[^/]+)/(?P<w>[^/]+)"), ("GET", r"/a/(?P<p>[^/]+)/(?P<q>[^/]+)"),
               ("GET", r"/a/b\.c")]


def test_routes_that_overlap_keep_the_first_added_in_any_order() -> None:
    """The registered routes barely overlap; these do in every way, added in every order."""
    words = ("a", "b", "c", "b.c", "bXc", "")
    paths = [""]
    for _ in range(4):
        paths += [path + "/" + word for path in paths for word in words]
    paths = sorted(set(paths))
    for order in itertools.permutations(OVERLAPPING[1:]):
        table: PathTable[int] = PathTable()
        for index, (method, pattern) in enumerate((OVERLAPPING[0], *order)):
            table.add(method, pattern, index)
        for path in paths:
            for method in ("GET", "POST", "PUT"):
                assert table.lookup(method, path) == linear(table.rows, method, path), (order, method, path)


_SEGMENT = st.one_of(
    st.sampled_from(sorted({part for row in ROWS for part in row.template.split("/")} | set(ODD))),
    st.text(alphabet=st.sampled_from("aZ09-_.~%2Fé/ \n{}"), max_size=6),
)


@settings(max_examples=1500, deadline=None, database=None)
@given(st.lists(_SEGMENT, max_size=7), st.sampled_from(["", "/", "//"]), st.booleans())
def test_generated_paths_route_as_the_linear_scan_does(segments: list[str], tail: str, admin: bool) -> None:
    _agree(("/admin/" if admin else "/") + "/".join(segments) + tail)


@pytest.mark.parametrize("pattern", [
    r"/admin/logs/export.csv",  # "." would be any character
    r"/admin/users/(?P<id>\d+)",
    r"/admin/users/x(?P<id>[^/]+)",
    r"/admin/users/(?P<id>[^/]+)/(?P<id>[^/]+)",
    r"/admin/users/",
    r"/admin/(users|keys)",
    r"/admin/users?",
    "",
])
def test_a_pattern_the_table_cannot_mean_exactly_is_refused(pattern: str) -> None:
    with pytest.raises(ValueError):
        PathTable[None]().add("GET", pattern, None)
