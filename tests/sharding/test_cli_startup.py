"""The CLI starts without torch: `shardify write/inspect/verify/gc` never need it, and importing it costs
2-3 CPU-seconds per process (only `shardify which` loads it, when it runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_cli_module_does_not_import_torch() -> None:
    code = "import sys, sharding.cli; sys.exit(3 if 'torch' in sys.modules else 0)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:] or "importing sharding.cli imported torch"
