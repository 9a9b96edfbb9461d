"""`python -m tools.demo --text --quick`: the bundled corpus tokenized, a tiny GPT trained on 2 ranks, the
loss falling (the demo itself fails otherwise)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.trainer.harness import REPO, env_for, finish

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_quick_text_demo_trains_and_the_loss_falls(tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "tools.demo", "--text", "--quick", "--out", str(tmp_path / "demo")],
                            cwd=REPO, env=env_for(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    result = finish(proc, timeout_s=150)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "demo: the loss fell from" in result.stdout
    assert "tokens/s per rank" in result.stdout and "validation: loss" in result.stdout
