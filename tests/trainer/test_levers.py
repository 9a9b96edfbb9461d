"""The all-reduce levers, the bill and TensorBoard on a real 2-rank torchrun job with known costs."""

from __future__ import annotations

import pytest

from tests.trainer.harness import ok, run_trainer, summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

FAKE = "tests.trainer.fakes:sleepy"
DELAY_S = 0.15


def _scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_a_delaying_comm_hook_is_reported_as_exposed_comm_priced_and_logged(tmp_path):
    pytest.importorskip("tensorboard")
    out, tb = tmp_path / "out", tmp_path / "tb"
    ok(run_trainer(["--data", "synthetic:?samples=4000&classes=4", "--model", FAKE, "--batch-size", "4",
                    "--image-size", "4", "--max-steps", "9", "--log-every", "4", "--out", str(out),
                    "--resume", "none", "--dist-timeout-s", "60", "--num-threads", "1",
                    "--comm-hook", "tests.trainer.fakes:delayed_allreduce", "--bucket-cap-mb", "1",
                    "--price-per-hour", "3", "--tensorboard", str(tb)],
                   env={"FAKE_COMPUTE_S": "0.05", "FAKE_COMM_DELAY_S": str(DELAY_S)}))
    rep = summary(out)
    # One bucket (a 3->4 linear layer), delayed at the end of backward: all of it exposed. A rank that
    # reaches the all-reduce first also waits for its peer (scheduling jitter on a busy machine), so the
    # last to arrive shows the delay itself.
    # Injected delays are checked from below only (a sleep lasts at least its length, longer under load).
    exposed = [r["comm_exposed_s"] / r["steps"] for r in rep["ranks"]]
    assert all(e >= DELAY_S for e in exposed), exposed
    for r in rep["ranks"]:
        # The delay is not counted as compute too: the stages fit in the step, no second count.
        assert r["wait_s"] + r["compute_s"] + r["comm_exposed_s"] <= r["step_s"], r
    assert rep["job"]["grad_bytes"] == (3 * 4 + 4) * 4 and rep["job"]["num_threads"] == 1
    c = rep["cost"]  # the bill follows from the measured rate: 2 ranks x $3/h
    assert c["dollars_per_1k_samples"] == pytest.approx(1000 * 6 / 3600 / rep["samples_per_s"])
    assert c["dollars_per_epoch"] == pytest.approx(6 / 3600 * rep["job"]["epoch_samples"] / rep["samples_per_s"])
    share = rep["stage_share"]
    assert c["wasted_share"] == pytest.approx(share["wait"] + share["comm_exposed"])
    scalars = _scalars(tb)
    assert [s for s, _ in scalars["train/samples_per_s"]] == [4, 8]
    assert {"train/loss", "train/lr", "train/data_wait_share", "stage_ms/compute/rank1"} <= set(scalars)
    # Per interval, as in the summary: each rank's figure is at least the delay (TensorBoard keeps
    # float32: a hair of rounding allowed).
    per_step = dict(scalars["stage_ms/comm_exposed/rank0"])
    for step, ms in scalars["stage_ms/comm_exposed/rank1"]:
        both = (per_step[step], ms)
        assert all(m >= 1000 * DELAY_S * (1 - 1e-6) for m in both), (step, both)


@pytest.mark.parametrize("hook", ["fp16", "powersgd"])
def test_compressing_hooks_shrink_the_wire_bytes_and_train(tmp_path, hook):
    out = tmp_path / "out"
    # 0.3 MB of ResNet gradients: one bucket at the default cap (PowerSGD on gloo needs that), several at 0.05
    cap = "25" if hook == "powersgd" else "0.05"
    ok(run_trainer(["--data", "synthetic:?samples=2000&classes=4", "--batch-size", "8", "--image-size", "8",
                    "--max-steps", "5", "--log-every", "2", "--out", str(out), "--resume", "none",
                    "--dist-timeout-s", "60", "--comm-hook", hook, "--bucket-cap-mb", cap]))
    job = summary(out)["job"]
    if hook == "fp16":
        assert job["wire_bytes"] == job["grad_bytes"] / 2 and job["buckets_per_step"] > 1
    else:  # rank-1 factors after two plain steps: far fewer bytes than the gradients
        assert 0 < job["wire_bytes"] < job["grad_bytes"] / 4 and job["buckets_per_step"] == 1
    assert all(r["comm_overlapped_s"] + r["comm_exposed_s"] > 0 for r in summary(out)["ranks"])
