"""The demos' steps: each one the command a user would type, echoed, timed, and fatal when it fails."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def _bin(name: str) -> str:
    """A console script of this environment (next to the running python)."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


def _run(title: str, cmd: list[str]) -> None:
    print(f"\n=== {title}\n$ {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    done = subprocess.run(cmd, check=False)
    if done.returncode != 0:
        sys.exit(f"demo: step '{title}' failed with exit code {done.returncode}")
    print(f"--- {title}: {time.perf_counter() - start:.1f} s", flush=True)
