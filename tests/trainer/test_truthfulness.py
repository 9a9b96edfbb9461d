"""The overlap report tells the truth: 2 real torchrun/gloo ranks, a loader and a model of known cost.

Time rule: an injected delay is checked only from below (a sleep lasts at least its length; on a
loaded machine it may last longer), never as a window or a ratio; the verdicts and the straggler
follow from costs that differ tenfold, so load does not change them.
"""

from __future__ import annotations

import json

import pytest

from tests.trainer.harness import ok, run_trainer, summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

FAKE = "tests.trainer.fakes:sleepy"


def _run(tmp_path, data: str, env: dict[str, str], steps: int = 12) -> dict:
    out = tmp_path / "out"
    ok(run_trainer(["--data", data, "--model", FAKE, "--batch-size", "4", "--image-size", "4",
                    "--max-steps", str(steps), "--log-every", "4", "--out", str(out), "--resume", "none",
                    "--dist-timeout-s", "60"], env=env))
    return summary(out)


def test_input_bound_wait_covers_the_injected_delay(tmp_path):
    # Every batch takes 150 ms to produce, in next() itself; a step computes for 10 ms.
    rep = _run(tmp_path, "synthetic:?samples=4000&classes=4&delay_s=0.15", {"FAKE_COMPUTE_S": "0.01"})
    for r in rep["ranks"]:
        assert r["wait_s"] / r["steps"] >= 0.15, r  # every step waited out the injected delay
        assert r["read_s"] / r["steps"] >= 0.15, r  # and the loader reported it as its own work
        # The loading ran inside next(), within the wait around it: none of it was hidden.
        assert r["hidden_load_s"] == 0.0, r
    assert rep["verdict"].startswith("INPUT-BOUND"), rep["verdict"]


def test_compute_bound_wait_share_near_zero_and_loading_hidden(tmp_path):
    # A thread produces batches 2 ahead at 30 ms each while a step computes for 100 ms: all hidden.
    rep = _run(tmp_path, "synthetic:?samples=4000&classes=4&delay_s=0.03&prefetch=2", {"FAKE_COMPUTE_S": "0.1"})
    for r in rep["ranks"]:
        assert r["compute_s"] / r["steps"] >= 0.1, r  # the injected compute, counted as compute
        assert r["read_s"] / r["steps"] >= 0.03, r  # the injected loading, reported by the loader
        assert r["hidden_load_s"] > 0, r  # some of it ran while the rank computed
    assert rep["verdict"].startswith("COMPUTE-BOUND"), rep["verdict"]
    assert rep["straggler"] is None


def test_a_rank_slowed_on_purpose_is_named(tmp_path):
    rep = _run(tmp_path, "synthetic:?samples=4000&classes=4", {"FAKE_COMPUTE_S": "0.01", "FAKE_SLOW_RANK": "1",
                                                               "FAKE_SLOW_EXTRA_S": "0.1"}, steps=10)
    assert rep["straggler"] == 1 and rep["slowest_rank"] == 1, rep
    assert "straggler: rank 1" in rep["verdict"]
    _, slow = rep["ranks"]
    assert slow["compute_s"] / slow["steps"] >= 0.11, rep  # the injected 10 + 100 ms, as compute
    out = tmp_path / "out"
    trace = json.loads((out / "trace.json").read_text())
    names = {(e["pid"], e["name"]) for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {(0, "comm (exposed)"), (1, "forward+backward"), (0, "data wait")} <= names
    assert (out / "steps.png").stat().st_size > 1000
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["kind"] == "train"] == [4, 8]
