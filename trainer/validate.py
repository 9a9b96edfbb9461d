"""Validation: every held-out sample exactly once across ranks (padded tail masked), sums reduced over ranks."""

from __future__ import annotations


import torch
from torch import nn

from dataio.loader.protocol import TrainLoader
from trainer import runtime
from trainer.accel import Accel
from trainer.data import to_device


@torch.no_grad()
def evaluate(model: nn.Module, loader: TrainLoader, rt: runtime.Runtime, *, epoch: int, accel: Accel,
             features: tuple[str, ...] = ()) -> dict[str, float]:
    """Loss and accuracy over the whole validation split; the same numbers on every rank.

    The loader pads its tail (mask False on repeats), so every rank runs the same number of
    batches and only real samples are counted.
    """
    was_training = model.training
    model.eval()
    loader.set_epoch(epoch)
    loss_sum, correct, count = 0.0, 0.0, 0.0
    try:
        for batch in loader:
            inputs, labels, mask = to_device(batch, rt.device, features)
            with accel.autocast():
                logits = model(accel.inputs(inputs))
            losses = nn.functional.cross_entropy(logits.float(), labels.clamp(min=0), reduction="none")
            keep = mask & (labels >= 0)
            loss_sum += float(losses[keep].sum())
            correct += float((logits.argmax(1) == labels)[keep].sum())
            count += float(keep.sum())
    finally:
        model.train(was_training)
    loss_sum, correct, count = runtime.all_sum(rt, [loss_sum, correct, count])
    return {"loss": loss_sum / max(count, 1.0), "accuracy": correct / max(count, 1.0), "samples": int(count)}
