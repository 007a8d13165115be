"""The configuration is written once: the structs Python encodes (meshfast.snapshot) against the
shape the core decodes (``_core.config_schema``, read from its serde types), field by field."""

from __future__ import annotations

import json
from typing import Any

import msgspec.inspect as mi

from meshfast import snapshot
from meshfast._core import config_schema

# Fields Python writes as free-form maps: data protection's policies (built by
# meshfast.admin.dlp.to_config, checked by its own tests) and an issuer's claim names (a map whose
# keys the admin API checks against the same names the core's struct has).
FREE_FORM = {"Config.dlp", "Config.issuers[].claims"}


def _python_shape(t: mi.Type) -> Any:
    """The same shape notation as the core's: a struct is a dict of its fields in order, a
    sequence a one-element list, anything else None."""
    if isinstance(t, mi.UnionType):
        kinds = [x for x in t.types if not isinstance(x, mi.NoneType)]
        return _python_shape(kinds[0]) if len(kinds) == 1 else None
    if isinstance(t, mi.StructType):
        return {f.encode_name: _python_shape(f.type) for f in t.fields} | {"__array_like__": t.array_like}
    if isinstance(t, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
        return [_python_shape(t.item_type)]
    return None


def _compare(path: str, py: Any, core: Any, problems: list[str]) -> None:
    if path in FREE_FORM:
        return
    if isinstance(py, dict) and isinstance(core, dict):
        array_like = py.pop("__array_like__")
        if array_like:
            # NOTE: an array-like struct is decoded by position: the order is the contract.
            if list(py) != list(core):
                problems.append(f"{path}: positions {list(py)} (Python) != {list(core)} (core)")
                return
        for name in sorted(set(py) - set(core)):
            problems.append(f"{path}.{name}: written by Python, never read by the core")
        for name in sorted(set(core) - set(py)):
            problems.append(f"{path}.{name}: read by the core, never written by Python")
        for name in py.keys() & core.keys():
            _compare(f"{path}.{name}", py[name], core[name], problems)
    elif isinstance(py, list) and isinstance(core, list):
        _compare(f"{path}[]", py[0], core[0], problems)
    elif (py is None) != (core is None) or type(py) is not type(core):
        problems.append(f"{path}: {type(py).__name__} (Python) != {type(core).__name__} (core)")


def _problems(root: type, core: Any) -> list[str]:
    problems: list[str] = []
    _compare(root.__name__, _python_shape(mi.type_info(root)), core, problems)
    return problems


def test_every_config_field_python_writes_is_one_the_core_reads_and_back() -> None:
    """Each struct of the config has the same fields on both sides (the same positions for an
    array-like one), down to the leaves: a field added on one side only fails here."""
    core = json.loads(config_schema())
    assert "providers" in core and isinstance(core["providers"][0], dict)
    assert _problems(snapshot.Config, core) == []


def test_the_check_sees_a_field_on_one_side_only() -> None:
    """The comparison itself: a renamed field and a reordered array-like struct are reported."""
    core = json.loads(config_schema())
    core["keys"][0]["digest_renamed"] = core["keys"][0].pop("digest")
    terms = core["grant_table"]["terms"][0]
    core["grant_table"]["terms"][0] = dict(reversed(list(terms.items())))
    problems = _problems(snapshot.Config, core)
    assert "Config.keys[].digest: written by Python, never read by the core" in problems
    assert "Config.keys[].digest_renamed: read by the core, never written by Python" in problems
    assert any(p.startswith("Config.grant_table.terms[]: positions") for p in problems), problems


def test_the_admin_apis_claim_names_are_the_cores() -> None:
    """An issuer's claim map is free-form on the wire to the core; the admin API's body names the
    same attributes the core's claim struct reads."""
    from meshfast.admin.issuers import Claims

    core = json.loads(config_schema())
    assert sorted(Claims.__struct_fields__) == sorted(core["issuers"][0]["claims"])
