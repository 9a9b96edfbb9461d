"""Relative paths inside a dataset prefix: what a manifest may name (never '..', a scheme or '/')."""

from __future__ import annotations

import re
from collections.abc import Sequence

# Non-empty segments without slashes or backslashes, no ':' in the first: most safe paths match,
# leaving only the '.'/'..' and '://' checks (a manifest checks 200k paths per 100k shards).
_PLAIN_REL = re.compile(r"[^/\\:]+(?:/[^/\\]+)*\Z")


def check_relative(rel: str) -> str:
    """Return `rel` if it is a safe relative path inside a prefix; raise ValueError otherwise."""
    if not isinstance(rel, str):
        raise ValueError(f"path {rel!r} must be a string")
    if "\n" in rel or "\r" in rel or "\0" in rel:
        raise ValueError(f"path {rel!r} must not contain line breaks or NUL")
    if _PLAIN_REL.match(rel) and "://" not in rel:
        if not rel.startswith(".") and "/." not in rel:
            return rel  # fast path: no segment starts with a dot, so none is '.' or '..'
        if not any(p in (".", "..") for p in rel.split("/")):
            return rel
    if not rel or rel.startswith(("/", "\\")) or "\\" in rel or "://" in rel or ":" in rel.split("/")[0]:
        raise ValueError(f"path {rel!r} must be relative to the dataset prefix (no scheme, no leading /)")
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"path {rel!r} must stay inside the dataset prefix (no '..', '.' or empty parts)")
    return rel


# Substrings any unsafe path contains (in one joined string, one path per line); paths holding
# none of them are safe, the rest get the exact per-path check.
_SUSPECT = ("\\", ":", "//", "\n\n", "/\n", "\n/", "/.", "\n.")


def check_relative_many(paths: Sequence[str]) -> None:
    """check_relative for many paths at once (a manifest's 200k): fast scan, exact check on suspects."""
    try:
        joined = "\n".join(paths)
    except TypeError:
        joined = ""
    if (
        joined
        and joined.count("\n") == len(paths) - 1
        and not joined.startswith(("/", ".", "\n"))
        and not joined.endswith(("/", "\n"))
        and not any(s in joined for s in _SUSPECT)
    ):
        return
    for rel in paths:
        check_relative(rel)
