"""`--model clip_vit`: the CLIP with a small ViT image tower, built with torchvision's VisionTransformer
where torchvision imports. It does not import in this venv, so a stand-in module takes its place (as the
torchvision-model tests do); without one, the model is refused saying so."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

from trainer.clip import CLIP, CLIP_MODELS, contrastive_loss
from trainer.models import build_model, vit_patch_size


@pytest.fixture
def vit_standin(monkeypatch):
    """torchvision.models.vision_transformer with a VisionTransformer taking torchvision's arguments."""
    built = []

    class VisionTransformer(nn.Module):
        def __init__(self, *, image_size: int, patch_size: int, num_layers: int, num_heads: int, hidden_dim: int,
                     mlp_dim: int, num_classes: int) -> None:
            super().__init__()
            assert image_size % patch_size == 0 and hidden_dim % num_heads == 0  # what torchvision checks
            built.append(dict(image_size=image_size, patch_size=patch_size, num_layers=num_layers,
                              num_heads=num_heads, hidden_dim=hidden_dim, mlp_dim=mlp_dim, num_classes=num_classes))
            self.patches = nn.Conv2d(3, hidden_dim, patch_size, stride=patch_size)
            self.head = nn.Linear(hidden_dim, num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.patches(x).flatten(2).mean(2))

    vision = types.ModuleType("torchvision.models.vision_transformer")
    vision.VisionTransformer = VisionTransformer  # type: ignore[attr-defined]
    models = types.ModuleType("torchvision.models")
    models.vision_transformer = vision  # type: ignore[attr-defined]
    package = types.ModuleType("torchvision")
    package.models = models  # type: ignore[attr-defined]
    for name, module in (("torchvision", package), ("torchvision.models", models),
                         ("torchvision.models.vision_transformer", vision)):
        monkeypatch.setitem(sys.modules, name, module)
    return built


def test_clip_vit_builds_a_small_vit_tower_that_trains(vit_standin) -> None:
    model = build_model("clip_vit", num_classes=300, image_size=32, sizes={"context_length": 8})
    assert isinstance(model, CLIP) and "clip_vit" in CLIP_MODELS
    assert vit_standin == [dict(image_size=32, patch_size=8, num_layers=4, num_heads=4, hidden_dim=128, mlp_dim=256,
                                num_classes=64)]
    images, ids = torch.rand(4, 3, 32, 32), torch.randint(1, 300, (4, 8))
    image, text, scale = model(images, ids, torch.ones(4, 8, dtype=torch.int64))
    assert image.shape == text.shape == (4, 64)
    loss = contrastive_loss(image, text, scale)
    loss.backward()
    assert all(p.grad is not None for p in model.visual.parameters())  # the tower trains under the CLIP loss


def test_patches_tile_the_image_at_least_four_by_four() -> None:
    assert [vit_patch_size(n) for n in (224, 64, 32, 16, 12, 7)] == [16, 16, 8, 4, 2, 1]


def test_without_torchvision_clip_vit_is_refused_saying_so(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import fails, as on this machine
    monkeypatch.setitem(sys.modules, "torchvision.models", None)
    monkeypatch.setitem(sys.modules, "torchvision.models.vision_transformer", None)
    with pytest.raises(ValueError, match="torchvision does not import here .*use --model clip"):
        build_model("clip_vit", num_classes=300, image_size=32, sizes={"context_length": 8})
