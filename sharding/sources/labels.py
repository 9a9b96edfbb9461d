"""Label columns as integers: integer labels kept, names mapped to their (sorted or given) order.

A column mixing integers with other strings is refused, naming its first offending row: mapping
every value to its rank among sorted strings would silently renumber the integers (label 2
stored as 4).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from sharding.sources.base import SourceError

_INT = re.compile(r"\s*[+-]?\d+\s*\Z")
_FIX = ("make every label an integer, or every label a name (their order: sorted, or given with "
        "--label-names a,b,c or --label-names @FILE)")


def _is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, str) and bool(_INT.match(value))


def read_label_names(text: str) -> tuple[str, ...]:
    """--label-names: `a,b,c`, or `@FILE` with one name a line (blank lines ignored)."""
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                names = [line.strip() for line in f if line.strip()]
        except OSError as exc:
            raise ValueError(f"--label-names {text}: cannot read ({exc.strerror or exc})") from None
    else:
        names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--label-names {text!r}: no names given")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"--label-names: {dup!r} appears more than once")
    return tuple(names)


def to_labels(values: Sequence[Any], where: str, column: str,
              names: Sequence[str] | None = None) -> tuple[list[int | None], tuple[str, ...] | None]:
    """Integer labels, and the label names if the column held names (or `names` was given).

    A missing label (null, or NaN: how pandas writes a missing value) is None."""
    values = [None if isinstance(v, float) and math.isnan(v) else v for v in values]
    bad = next(((row, v) for row, v in enumerate(values)
                if isinstance(v, float) and not v.is_integer()), None)
    if bad is not None:
        raise SourceError(f"{where} row {bad[0]}: label {bad[1]!r} in column {column!r} is not a whole number; "
                          "labels are class numbers (0, 1, ...) or class names")
    if names is not None:
        return _by_names(values, where, column, tuple(names)), tuple(names)
    present = [(row, v) for row, v in enumerate(values) if v is not None]
    ints = [(row, v) for row, v in present if _is_int(v)]
    if len(ints) == len(present):
        out = [None if v is None else int(v) for v in values]
        bad = next(((row, v) for row, v in ints if int(v) < 0), None)
        if bad is not None:
            raise SourceError(f"{where} row {bad[0]}: label {bad[1]!r} in column {column!r} is negative; labels must be >= 0")
        return out, None
    if ints:
        others = [(row, v) for row, v in present if not _is_int(v)]
        # The rarer kind is the odd one out; its first row is the one to fix.
        row, value = (ints if len(ints) < len(others) else others)[0]
        raise SourceError(
            f"{where} row {row}: label {value!r} in column {column!r}: the column mixes integer labels "
            f"({len(ints)} rows, e.g. {ints[0][1]!r}) with other strings ({len(others)} rows, e.g. "
            f"{others[0][1]!r}), and mapping them to names would renumber the integers; {_FIX}"
        )
    sorted_names = tuple(sorted({str(v) for _, v in present}))
    index = {n: i for i, n in enumerate(sorted_names)}
    return [None if v is None else index[str(v)] for v in values], sorted_names


def _by_names(values: Sequence[Any], where: str, column: str, names: tuple[str, ...]) -> list[int | None]:
    index = {n: i for i, n in enumerate(names)}
    out: list[int | None] = []
    for row, v in enumerate(values):
        if v is None:
            out.append(None)
        elif str(v) in index:
            out.append(index[str(v)])
        elif _is_int(v) and not isinstance(v, str) and 0 <= int(v) < len(names):
            out.append(int(v))  # an integer label already indexes the given names
        else:
            raise SourceError(f"{where} row {row}: label {v!r} in column {column!r} is not one of --label-names "
                              f"{list(names)[:10]}; add it there, or fix the row")
    return out
