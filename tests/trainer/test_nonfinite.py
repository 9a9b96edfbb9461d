"""A NaN or inf loss stops the run (issue 32, failure 1): on every rank in the same step, exit 1, the step,
rank and samples named; no checkpoint from non-finite weights; metrics.jsonl valid JSON; the spike
watch sees NaN as a spike and keeps its median finite. It used to train to the end and exit 0."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trainer import nonfinite
from trainer.spikes import MIN_STEPS, SpikeWatch
from tests.trainer.harness import resumable_args, run_trainer


def _strict(line: str) -> dict:
    """json.loads that refuses bare NaN / Infinity, as every JSON reader but Python's does."""
    def refuse(name: str) -> None:
        raise ValueError(f"bare {name} in {line!r}")
    return json.loads(line, parse_constant=refuse)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_loss_carries_nan_into_every_gradient(bad: float) -> None:
    layer = nn.Linear(3, 2)
    loss = layer(torch.ones(1, 3)).sum() * 0 + torch.tensor(bad)  # finite gradients on their own (zeros)
    nonfinite.carried(loss).backward()
    assert all(torch.isnan(p.grad).all() for p in layer.parameters())
    layer.zero_grad()
    good = layer(torch.ones(1, 3)).sum()
    nonfinite.carried(good).backward()
    assert torch.equal(layer.weight.grad, torch.ones(2, 3))


def test_check_step_names_the_step_the_rank_and_the_samples() -> None:
    layer = nn.Linear(3, 2)
    layer(torch.ones(1, 3)).sum().backward()
    nonfinite.check_step(step=4, rank=1, loss=0.5, model=layer, keys=["a"])  # finite: nothing
    keys = [f"k{i}" for i in range(10)]
    with pytest.raises(nonfinite.NonFiniteStep, match=r"^step 4: the loss is nan on rank 1 \(its samples: k0, "
                                                      r"k1, .*k7 and 2 more\)\. Stopped before the optimizer step"):
        nonfinite.check_step(step=4, rank=1, loss=math.nan, model=layer, keys=keys)
    layer.weight.grad.fill_(math.inf)
    with pytest.raises(nonfinite.NonFiniteStep, match=r"step 5: the gradient norm is inf .* rank 0's loss 0\.5 "):
        nonfinite.check_step(step=5, rank=0, loss=0.5, model=layer, keys=keys)
    nonfinite.check_step(step=5, rank=0, loss=0.5, model=layer, keys=keys, grads_checked=False)  # a scaler's job


def test_no_checkpoint_is_stored_from_non_finite_weights() -> None:
    events, warnings = [], []
    recorder = SimpleNamespace(event=events.append, warn=warnings.append)
    run = SimpleNamespace(model=nn.Linear(3, 2), recorder=recorder, step=7, epoch=0, last_saved_step=6)
    assert not nonfinite.refused_save(run)
    with torch.no_grad():
        run.model.bias[1] = math.inf
    assert nonfinite.refused_save(run)
    assert events == [{"kind": "checkpoint_refused", "step": 7, "epoch": 0, "parameter": "bias"}]
    assert warnings == ["checkpoint at step 7 NOT stored: parameter bias holds NaN or inf (last stored: step 6)"]


def test_metrics_records_stay_valid_json() -> None:
    record = {"kind": "interval", "loss": math.nan, "lr": 0.1, "ranks": [{"loss": math.inf}], "median": {"0": -math.inf}}
    line = json.dumps(nonfinite.finite_json(record), allow_nan=False)
    assert _strict(line) == {"kind": "interval", "loss": None, "loss_nonfinite": "nan", "lr": 0.1,
                             "ranks": [{"loss": None, "loss_nonfinite": "inf"}],
                             "median": {"0": None, "0_nonfinite": "-inf"}}


def test_the_spike_watch_flags_nan_and_keeps_its_median_finite() -> None:
    watch = SpikeWatch(3.0)
    assert watch.observe(1, math.nan, rank=0)["median"] is None  # a spike before the median exists, too
    assert all(watch.observe(s, 1.0, rank=0) is None for s in range(2, MIN_STEPS + 2))
    for s in range(100, 133):  # 33 NaN steps: each a spike, none in the median
        assert watch.observe(s, math.nan, rank=0)["median"] == 1.0
    assert watch.observe(200, math.inf, rank=0)["median"] == 1.0
    assert watch.observe(201, 1000.0, rank=0) == {"step": 201, "rank": 0, "loss": 1000.0, "median": 1.0}


@pytest.mark.slow  # torchrun, 2 ranks
@pytest.mark.timeout(240)
def test_a_nan_loss_on_one_rank_stops_every_rank_in_that_step(resumable_dataset: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = resumable_args(resumable_dataset, out, "--epochs", "1", "--checkpoint-every", "2")
    args[args.index("tests.trainer.fakes:sleepy")] = "tests.trainer.fakes:nan_later"
    got = run_trainer(args, nproc=2, env={"FAKE_NAN_AT": "4", "FAKE_NAN_RANK": "1"}, timeout_s=180)
    assert got.returncode == 1, got.stderr[-3000:]
    assert "trainer/train.py" not in got.stderr, got.stderr[-3000:]  # (torchrun prints its own traceback)
    keys = [json.loads(x) for x in (out / "keys-rank1.jsonl").read_text().splitlines()]
    assert [k["step"] for k in keys] == [1, 2, 3]  # step 4 never committed
    assert "step 4: the loss is nan on rank 1 (its samples: " in got.stderr, got.stderr[-3000:]
    assert "step 4: the gradient norm is nan after the all-reduce, while rank 0's loss" in got.stderr
    stored = sorted(p.name for p in (out / "checkpoints").glob("ckpt-*.pt"))
    assert stored == ["ckpt-000000002.pt"]
    lines = [_strict(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["kind"] == "stopped" and lines[-1]["step"] == 4
