"""The JSON schema of ``matrix.yaml``, made from the places its settings are declared: the top
keys and the generations' sections (``matrix.py``), the axes (``expand.py``), the settings
sections (the fields of ``model.Bases``, ``Packages`` and ``BuildOptions``), the choices of the
values that have a few (``grammar.py``). Editors read it (``fa-images schema``; the header that
``init`` writes names it); the loader stays the judge of every value's grammar.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

from . import generations, grammar
from .expand import AXES, MATRIX_RULES
from .matrix import top_keys
from .model import Bases, BuildOptions, Packages

SCHEMA_ID = "https://fa-images.invalid/matrix.schema.json"  # names it; nothing is fetched from there
_STRING = {"type": "string"}
_VERSIONS = {  # a version, a list of them, or a rule (a specifier, or {versions, newest})
    "anyOf": [
        _STRING,
        {"type": "array", "items": _STRING, "minItems": 1},
        {
            "type": "object",
            "properties": {"versions": _STRING, "newest": {"type": "integer", "minimum": 1}},
            "additionalProperties": False,
        },
    ]
}
_ARCH = {"anyOf": [{"type": "integer"}, _STRING]}
_AXIS: dict[str, dict] = {
    "python": _VERSIONS,
    "torch": _VERSIONS,
    "cuda": _VERSIONS,
    "flash_attn": _VERSIONS,
    # A GPU, a family or a target name; a list gives an entry per value, a list in it one entry for all.
    "target": {
        "anyOf": [_STRING, {"type": "array", "items": {"anyOf": [_STRING, {"type": "array", "items": _STRING}]}}]
    },
    "archs": {"anyOf": [_ARCH, {"type": "array", "items": {"anyOf": [_ARCH, {"type": "array", "items": _ARCH}]}}]},
    "ptx": {"anyOf": [{"type": "boolean"}, {"type": "array", "items": {"type": "boolean"}}]},
}
_SHAPES = {int: {"type": "integer"}, str: _STRING, bool: {"type": "boolean"}}
_CHOICES = {("build", "pull"): grammar.PULL_POLICIES, ("build", "builder"): grammar.BUILDER_CHOICES}


def matrix_schema() -> dict[str, Any]:
    """The schema, as a JSON document (draft 2020-12)."""
    if set(_AXIS) != set(AXES):
        raise AssertionError(f"the schema's axes {sorted(_AXIS)} are not the matrix's {sorted(AXES)}")
    combination = {"type": "object", "properties": _AXIS, "additionalProperties": False}
    properties: dict[str, Any] = {
        "image": {**_STRING, "description": "the image repository every entry's tag goes to"},
        "targets": {"type": "object", "additionalProperties": {"type": "array", "items": _STRING, "minItems": 1}},
        "matrix": {
            "type": "object",
            "properties": {
                **_AXIS,
                **{rule: {"type": "array", "items": {"type": "object"}} for rule in MATRIX_RULES},
            },
            "additionalProperties": False,
        },
        "entries": {"type": "array", "items": combination},
        "bases": _section("bases", Bases),
        "packages": _section("packages", Packages),
        "build": _section("build", BuildOptions),
        **{section.key: _generation(section) for section in generations.sections()},
        "compat": {**_STRING, "description": "a compat table file merged over the built-in one"},
        "allow_unknown": {"type": "boolean"},
    }
    if set(properties) != set(top_keys()):
        raise AssertionError(f"the schema's keys {sorted(properties)} are not the matrix's {sorted(top_keys())}")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "fa-images matrix.yaml",
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }


def text() -> str:
    return json.dumps(matrix_schema(), indent=2, sort_keys=True) + "\n"


def _section(key: str, cls: Any) -> dict[str, Any]:
    """A settings section: each field of its dataclass, typed as its annotation says."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: _of_type(hints[f.name], _CHOICES.get((key, f.name))) for f in dataclasses.fields(cls)}
    return {"type": "object", "properties": fields, "additionalProperties": False}


def _of_type(hint: Any, choices: tuple[str, ...] | None) -> dict[str, Any]:
    if choices is not None:
        return {"enum": list(choices)}
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple:
        return {"type": "array", "items": _of_type(args[0], None)}
    if type(None) in args:  # X | None: null turns the setting off
        inner = _of_type(next(a for a in args if a is not type(None)), None)
        return {"anyOf": [inner, {"type": "null"}]}
    if typing.get_origin(hint) is typing.Literal:
        return {"enum": list(args)}
    return dict(_SHAPES[hint])


def _generation(section: generations.Section) -> dict[str, Any]:
    """A generation's section: a list of one type, or one number, per key."""
    properties = {
        name: {"type": "array", "items": _SHAPES[shape[0]]} if isinstance(shape, list) else _SHAPES[shape]
        for name, shape in section.fields.items()
    }
    return {"type": "object", "properties": properties, "additionalProperties": False}
