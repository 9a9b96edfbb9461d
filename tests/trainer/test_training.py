"""Training itself, in one process: the registry CNN learns 8x8 digits upscaled to 32x32, runs repeat exactly."""

from __future__ import annotations

import pytest
import torch

from trainer import runtime
from trainer.config import TrainConfig
from trainer.synthetic import MemoryLoader
from trainer.train import setup, train, wrap


def _digits(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1)  # [S,1,8,8], values 0..16
    x = torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)
    images = (x * (255 / 16)).clamp(0, 255).to(torch.uint8).expand(-1, 3, -1, -1).contiguous()
    return images, torch.tensor(d.target)


def _run(cfg: TrainConfig, train_loader, val_loader=None):
    rt = runtime.start(device="cpu", timeout_s=30, env={})
    run = setup(cfg, rt, loaders=(train_loader, val_loader))
    wrap(run)
    train(run)
    return run


@pytest.mark.slow  # ~40 CPU-s in process
@pytest.mark.timeout(300)  # longer where other test processes share the cores
def test_resnet_reaches_90_percent_on_digits(tmp_path):
    images, labels = _digits(32)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    fit, held = order[:1400], order[1400:]
    cfg = TrainConfig.from_options(data="memory:digits", model="resnet", num_classes=10, epochs=1, batch_size=16,
                                   lr=0.05, warmup_steps=10, image_size=32, out=str(tmp_path), resume="none",
                                   log_every=50, live=False)
    run = _run(cfg, MemoryLoader(images[fit], labels[fit], batch_size=16, rank=0, world_size=1, seed=0),
               MemoryLoader(images[held], labels[held], batch_size=64, rank=0, world_size=1, seed=0, tail="pad"))
    assert run.val is not None and run.val["samples"] == len(held)  # padded tail not counted
    assert run.val["accuracy"] >= 0.90, run.val


def test_same_seed_same_weights_and_adamw_accumulation(tmp_path):
    def once(name: str) -> dict[str, torch.Tensor]:
        cfg = TrainConfig.from_options(data="synthetic:?samples=96&classes=3", model="mlp", num_classes=3,
                                       batch_size=8, grad_accum=2, optimizer="adamw", lr=1e-3, warmup_steps=2,
                                       max_steps=4, image_size=8, out=str(tmp_path / name), resume="none",
                                       log_every=2, live=False, seed=7)
        from trainer.synthetic import synthetic_loader

        loader = synthetic_loader(cfg.data, batch_size=8, rank=0, world_size=1, seed=7, image_size=8)
        run = _run(cfg, loader)
        assert run.step == 4
        return {k: v.clone() for k, v in run.model.state_dict().items()}

    a, b = once("a"), once("b")
    assert all(torch.equal(a[k], b[k]) for k in a)
