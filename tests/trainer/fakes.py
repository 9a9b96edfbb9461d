"""Model factories with a known cost per step, for the truthfulness tests (`--model tests.trainer.fakes:sleepy`).

The cost comes from the environment the test sets (torchrun passes it to every rank):
FAKE_COMPUTE_S seconds of sleep in every forward, plus FAKE_SLOW_EXTRA_S on rank FAKE_SLOW_RANK.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn


class Sleepy(nn.Module):
    """A linear classifier over channel means whose forward takes a known time on this rank."""

    def __init__(self, num_classes: int, sleep_s: float) -> None:
        super().__init__()
        self.fc = nn.Linear(3, num_classes)
        self.sleep_s = sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.fc(x.mean(dim=(2, 3)))


def sleepy(*, num_classes: int, image_size: int) -> nn.Module:
    del image_size
    sleep_s = float(os.environ.get("FAKE_COMPUTE_S", "0"))
    if os.environ.get("RANK", "0") == os.environ.get("FAKE_SLOW_RANK", "-1"):
        sleep_s += float(os.environ.get("FAKE_SLOW_EXTRA_S", "0"))
    return Sleepy(num_classes, sleep_s)


def not_a_module(*, num_classes: int, image_size: int) -> object:
    return object()


def fails_on_rank1(*, num_classes: int, image_size: int) -> nn.Module:
    """Builds on rank 0, raises on rank 1: only one rank fails set-up."""
    if os.environ.get("RANK") == "1":
        raise RuntimeError("this factory refuses to build on rank 1")
    return Sleepy(num_classes, 0.0)


def delayed_allreduce() -> tuple[None, object]:
    """A --comm-hook factory: each bucket's all-reduce (mean) starts FAKE_COMM_DELAY_S late when there is
    more than one rank, a known comm cost. The sleep runs inside the hook, so the timing wrapper counts it
    from the bucket's call to its done."""
    import torch.distributed as dist

    delay_s = float(os.environ.get("FAKE_COMM_DELAY_S", "0"))

    def hook(state, bucket):  # noqa: ANN001, ANN202 - DDP checks annotations; none on purpose
        if delay_s and dist.get_world_size() > 1:
            time.sleep(delay_s)
        tensor = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(tensor, async_op=True).get_future()

    return None, hook


class NanLater(Sleepy):
    """Sleepy, whose logits turn NaN from its FAKE_NAN_AT-th training forward on rank FAKE_NAN_RANK."""

    def __init__(self, num_classes: int) -> None:
        super().__init__(num_classes, 0.0)
        self.calls = 0
        self.nan_at = int(os.environ.get("FAKE_NAN_AT", "0"))
        self.mine = os.environ.get("RANK", "0") == os.environ.get("FAKE_NAN_RANK", "0")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.training:
            self.calls += 1
            if self.mine and self.nan_at and self.calls >= self.nan_at:
                out = out * float("nan")
        return out


def nan_later(*, num_classes: int, image_size: int) -> nn.Module:
    del image_size
    return NanLater(num_classes)
