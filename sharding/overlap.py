"""Refuse a `shardify write` whose source and destination overlap, except re-sharding a dataset in place.

Writing into the source's tree (or reading a source inside the destination) would read its own
output or be mixed up with it. Re-sharding in place (`shardify write DS DS --overwrite`) is safe:
the source is the dataset's current manifest, whose shards stay untouched while the new
version is written beside them and for the grace period after it replaces them.
"""

from __future__ import annotations

import os

from dataio.format.manifest import MANIFEST_NAME
from sharding.sources.base import SourceError
from sharding.sources.tar import expand_braces


def _norm(location: str) -> tuple[str, str]:
    """(scheme, normalized path) of a local path or URL; local paths resolved through symlinks."""
    if "://" in location and not location.startswith("file://"):
        scheme, rest = location.split("://", 1)
        return scheme.lower(), "/" + rest.split("@", 1)[-1].strip("/")
    path = location.removeprefix("file://")
    return "file", os.path.realpath(path)


def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def source_roots(src: str) -> list[str]:
    """The locations a SRC argument reads: its brace-expanded files, or the path itself."""
    return expand_braces(src) if "{" in src else [src]


def check_overlap(src: str, dest: str, *, overwrite: bool, shown_src: str, shown_dest: str) -> None:
    """Raise SourceError when SRC and DEST overlap, unless DEST is SRC, a dataset, with --overwrite."""
    d_scheme, d_path = _norm(dest)
    for root in source_roots(src):
        s_scheme, s_path = _norm(root)
        if s_scheme != d_scheme:
            continue
        if s_path == d_path:
            is_dataset = d_scheme != "file" or os.path.isfile(os.path.join(d_path, MANIFEST_NAME))
            if overwrite and is_dataset:
                return  # re-shard in place: a new version beside the old, staged
            raise SourceError(
                f"source {shown_src} and destination {shown_dest} are the same place; re-sharding in place "
                "works only for a shardify dataset with --overwrite (the new version is written beside the "
                "old one); otherwise choose another destination"
            )
        if _inside(d_path, s_path) or _inside(s_path, d_path):
            raise SourceError(
                f"source {shown_src} and destination {shown_dest} overlap (one lies inside the other): the "
                "write would read its own output or mix with it; choose a destination outside the source"
            )
