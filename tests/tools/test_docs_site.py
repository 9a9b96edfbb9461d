"""The documentation site builds with MkDocs in strict mode (a broken link, a page missing from the
nav, a failing hook fail the build), as `make docs` serves it; run here so that `make test` builds it
beside the other tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(600)
def test_the_site_builds_in_strict_mode(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=570, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").is_file()
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "shardify write" in cli  # the generated CLI reference (docs/hooks.py) is in the site
