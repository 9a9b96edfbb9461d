"""The overlap report tells the truth: 2 real torchrun/gloo ranks, a loader and a model of known cost."""

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


def test_input_bound_wait_share_matches_the_injected_delay(tmp_path):
    # Every batch takes 150 ms to produce, in next() itself; a step computes for 10 ms.
    rep = _run(tmp_path, "synthetic:?samples=4000&classes=4&delay_s=0.15", {"FAKE_COMPUTE_S": "0.01"})
    truth = 0.15 / (0.15 + 0.01)
    assert abs(rep["wait_share"] - truth) / truth < 0.10, rep["wait_share"]
    for r in rep["ranks"]:
        assert abs(r["wait_s"] / r["steps"] - 0.15) / 0.15 < 0.10  # seconds per step, on each rank
        assert r["hidden_load_share"] < 0.15  # the loading ran in next(): nothing hidden
    assert rep["verdict"].startswith("INPUT-BOUND")


def test_compute_bound_wait_share_near_zero_and_loading_hidden(tmp_path):
    # A thread produces batches 2 ahead at 30 ms each while a step computes for 100 ms: all hidden.
    rep = _run(tmp_path, "synthetic:?samples=4000&classes=4&delay_s=0.03&prefetch=2", {"FAKE_COMPUTE_S": "0.1"})
    assert abs(rep["wait_share"] - 0.0) < 0.05, rep["wait_share"]
    assert rep["hidden_load_share"] > 0.8
    assert rep["verdict"].startswith("COMPUTE-BOUND")
    assert rep["straggler"] is None


def test_a_rank_slowed_on_purpose_is_named(tmp_path):
    rep = _run(tmp_path, "synthetic:?samples=4000&classes=4", {"FAKE_COMPUTE_S": "0.01", "FAKE_SLOW_RANK": "1",
                                                               "FAKE_SLOW_EXTRA_S": "0.1"}, steps=10)
    assert rep["straggler"] == 1 and rep["slowest_rank"] == 1, rep
    assert "straggler: rank 1" in rep["verdict"]
    fast, slow = rep["ranks"]
    # The fast rank waits for the slow one in all-reduce: exposed comm, not its own compute.
    assert fast["comm_exposed_s"] / fast["steps"] > 0.07, rep
    assert slow["compute_s"] / slow["steps"] > 0.1, rep
    out = tmp_path / "out"
    trace = json.loads((out / "trace.json").read_text())
    names = {(e["pid"], e["name"]) for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {(0, "comm (exposed)"), (1, "forward+backward"), (0, "data wait")} <= names
    assert (out / "steps.png").stat().st_size > 1000
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["kind"] == "train"] == [4, 8]
