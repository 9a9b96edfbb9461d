"""Small state files read by type: each declared field of a JSON object checked for type and range.

A lease, a loader-state sidecar and the like are JSON written by one shardify and read by another;
a file edited by hand, damaged, or written by something else may hold `"pid": "12345"`. Reading
it through `damage` turns every such field into one sentence naming it, instead of a TypeError
deep in the code that uses it. A bool is never taken for an int, an int is taken for a float,
and a float must be finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class Field:
    """One declared field: its types, and a range check with the words for it (e.g. ">= 1")."""

    types: tuple[type, ...]
    ok: Callable[[Any], bool] | None = None
    says: str = ""
    optional: bool = False  # may be absent (a file written before the field existed)


def typed(*types: type | None, ok: Callable[[Any], bool] | None = None, says: str = "",
          optional: bool = False) -> Field:
    """A field of one of `types` (None: null is allowed), passing `ok` (`says` is its words)."""
    return Field(types=tuple(type(None) if t is None else t for t in types), ok=ok, says=says, optional=optional)


def damage(doc: Any, fields: Mapping[str, Field]) -> str | None:
    """What is wrong with `doc` against `fields` (the first fault, in words), None when nothing is."""
    if not isinstance(doc, dict):
        return f"it holds a JSON {type(doc).__name__}, not an object"
    for name, field in fields.items():
        if name not in doc:
            if field.optional:
                continue
            return f"it has no {name!r}"
        value = doc[name]
        if isinstance(value, float) and not math.isfinite(value):
            return f"its {name!r} is {value!r}, not a finite number"
        if not _is(value, field.types):
            wanted = " or ".join(_NAMES.get(t, t.__name__) for t in field.types)
            return f"its {name!r} is {value!r} ({_NAMES.get(type(value), type(value).__name__)}), not {wanted}"
        if field.ok is not None and value is not None and not field.ok(value):
            return f"its {name!r} is {value!r}, not {field.says}"
    return None


def _is(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, float):
        return float in types
    if isinstance(value, int):
        return int in types or float in types
    return isinstance(value, types)


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true/false", dict: "an object",
          list: "a list", type(None): "null"}
