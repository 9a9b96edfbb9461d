"""Describe the machine a benchmark or the fault suite ran on, so a figure is never quoted without it.

Here in tools, not in benchmarks: benchmarks import tools, never the other way (pyproject.toml).
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def package_version(dist: str) -> str:
    """The installed version of distribution `dist`, or "not installed"."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe_machine() -> dict[str, str]:
    """CPU, cores, memory, OS, Python and the versions of the libraries compared."""
    try:
        import psutil

        mem_gib = f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    except ImportError:
        mem_gib = "unknown"
    return {
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count()),
        "memory": mem_gib,
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "torch": package_version("torch"),
        "webdataset": package_version("webdataset"),
        "nvidia-dali": package_version("nvidia-dali-cuda130"),
        "shardify": package_version("shardify"),
    }


def machine_markdown() -> str:
    """One "Machine: ..." line for a results file."""
    m = describe_machine()
    return (
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory']} RAM, {m['os']}; Python {m['python']}, "
        f"torch {m['torch']}, webdataset {m['webdataset']}, DALI {m['nvidia-dali']}, shardify {m['shardify']}."
    )
