"""The value types of `shardify`'s flags: sizes (256MB, 1GiB), durations (1h), counts, seconds, label names.

Each raises argparse.ArgumentTypeError saying what it expects, so argparse names the flag.
"""

from __future__ import annotations

import argparse
import os
import re


def num_cores() -> int:
    """Cores this process may run on (a container's CPU set, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """'256MB' -> 256_000_000, '1GiB' -> 1_073_741_824, '4096' -> 4096."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS or float(m.group(1)) * _UNITS[m.group(2).lower()] < 1:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: give a positive number with an optional unit B, KB, MB, GB, TB, "
            "KiB, MiB, GiB or TiB, e.g. 256MB or 1GiB"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


_SECONDS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'1h' -> 3600.0, '30m' -> 1800.0, '90' / '90s' -> 90.0, '0' -> 0.0."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _SECONDS:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: give a number with s, m, h or d, e.g. 1h")
    return float(m.group(1)) * _SECONDS[m.group(2).lower()]


def positive_int(text: str) -> int:
    """A whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: give a whole number >= 1")
    return value


def positive_seconds(text: str) -> float:
    """Seconds above 0 and at most an hour."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: give seconds above 0 and at most 3600")
    return value


def label_names(text: str) -> tuple[str, ...]:
    """Class names in label order: A,B,C or @FILE (sharding/sources/labels.py)."""
    from sharding.sources.labels import read_label_names

    try:
        return read_label_names(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
