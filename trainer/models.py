"""A small model registry (a compact ResNet-style CNN, an MLP, a GPT: trainer/gpt.py), torchvision's
classification models by name where torchvision imports, and user factories.

A model is built by `build_model(name, num_classes=, image_size=)`; `name` is a registry key, a
torchvision model name, or "package.module:function" called with the same keyword arguments.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

from trainer.clip import CLIP
from trainer.gpt import gpt


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet's basic block)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.skip = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))


class SmallResNet(nn.Module):
    """A compact ResNet for small images: stem, three stages of basic blocks, global pooling."""

    def __init__(self, num_classes: int, widths: tuple[int, ...] = (16, 32, 64), stem_stride: int = 1) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, stem_stride, 1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU())
        stages, c_in = [], widths[0]
        for i, width in enumerate(widths):
            stages.append(BasicBlock(c_in, width, stride=1 if i == 0 else 2))
            c_in = width
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: float [N, 3, H, W] -> logits [N, num_classes]
        y = self.stages(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


class MLP(nn.Module):
    """Two hidden layers over flattened input (tabular feature rows, or small images)."""

    def __init__(self, num_classes: int, in_features: int, hidden: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def resnet(*, num_classes: int, image_size: int, in_features: int = 0) -> nn.Module:
    """The compact ResNet-style CNN (about 0.2M parameters); images of 32 px or more enter at stride 2."""
    if in_features:
        raise ValueError("model 'resnet' takes images, not --features rows; use --model mlp")
    # Global pooling makes it size-independent; the strided stem keeps CPU cost low for upscaled small images.
    return SmallResNet(num_classes, stem_stride=2 if image_size >= 32 else 1)


def mlp(*, num_classes: int, image_size: int, in_features: int = 0) -> nn.Module:
    """An MLP over table rows of `in_features` columns, or over flattened 3 x image_size^2 images."""
    return MLP(num_classes, in_features=in_features or 3 * image_size * image_size)


def clip(*, num_classes: int, image_size: int, in_features: int = 0, context_length: int = 32,
         embed_dim: int = 64) -> nn.Module:
    """A small CLIP (trainer/clip.py) with the compact ResNet as image tower; num_classes: the vocabulary."""
    if in_features:
        raise ValueError("model 'clip' takes image-text pairs, not --features rows")
    visual = SmallResNet(embed_dim, stem_stride=2 if image_size >= 32 else 1)
    return CLIP(visual=visual, vocab_size=num_classes, context_length=context_length, embed_dim=embed_dim)


def clip_vit(*, num_classes: int, image_size: int, in_features: int = 0, context_length: int = 32,
             embed_dim: int = 64) -> nn.Module:
    """A small CLIP whose image tower is a small ViT (torchvision's VisionTransformer: 4 layers, 4 heads,
    width 128, patches of vit_patch_size); ValueError where torchvision does not import."""
    if in_features:
        raise ValueError("model 'clip_vit' takes image-text pairs, not --features rows")
    try:
        vision = importlib.import_module("torchvision.models.vision_transformer")
    except ImportError as exc:
        raise ValueError(f"model 'clip_vit' builds its image tower with torchvision's VisionTransformer, and "
                         f"torchvision does not import here ({exc}); use --model clip (the ResNet tower), or install "
                         "the torchvision built for this torch") from None
    visual = vision.VisionTransformer(image_size=image_size, patch_size=vit_patch_size(image_size), num_layers=4,
                                      num_heads=4, hidden_dim=128, mlp_dim=256, num_classes=embed_dim)
    return CLIP(visual=visual, vocab_size=num_classes, context_length=context_length, embed_dim=embed_dim)


def vit_patch_size(image_size: int) -> int:
    """The largest of 16, 8, 4, 2 and 1 pixels that tiles the image into at least 4 x 4 patches."""
    return next(p for p in (16, 8, 4, 2, 1) if image_size % p == 0 and image_size // p >= 4 or p == 1)


REGISTRY: dict[str, Callable[..., nn.Module]] = {"resnet": resnet, "mlp": mlp, "gpt": gpt, "clip": clip,
                                                 "clip_vit": clip_vit}


def resolve_factory(name: str) -> Callable[..., nn.Module]:
    """The factory for a registry key, a torchvision classification model's name (resnet50, vit_b_16, ...)
    or "package.module:function"; ValueError names the choices, and says when torchvision is missing."""
    if name in REGISTRY:
        return REGISTRY[name]
    if ":" not in name:
        return torchvision_factory(name)
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"model factory {name!r}: cannot import {module_name!r} ({exc})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"model factory {name!r}: {module_name!r} has no callable {attr!r}")
    return factory


def torchvision_factory(name: str) -> Callable[..., nn.Module]:
    """A factory for torchvision's classification model `name`, untrained (weights=None), with the
    run's classes (and image size for ViTs); ValueError when torchvision is absent or has no such model."""
    try:
        models = importlib.import_module("torchvision.models")
    except ImportError as exc:
        raise ValueError(f"unknown model {name!r}: not one of {sorted(REGISTRY)}, and torchvision, whose "
                         f"classification models (resnet50, vit_b_16, ...) it may name, does not import here ({exc}); "
                         "install the torchvision built for this torch, or give a factory 'package.module:function'"
                         ) from None
    known = models.list_models(module=models)  # the classification models (not detection, video, ...)
    if name not in known:
        raise ValueError(f"unknown model {name!r}: use one of {sorted(REGISTRY)}, a torchvision classification "
                         f"model ({', '.join(sorted(known)[:8])}, ...) or a factory 'package.module:function'")

    def factory(*, num_classes: int, image_size: int, in_features: int = 0) -> nn.Module:
        if in_features:
            raise ValueError(f"model {name!r} takes images, not --features rows; use --model mlp")
        sized = {"image_size": image_size} if name.startswith("vit_") else {}  # ViTs are built for one size
        return models.get_model(name, weights=None, num_classes=num_classes, **sized)

    return factory


def build_model(name: str, *, num_classes: int, image_size: int, in_features: int = 0,
                sizes: dict[str, int] | None = None) -> nn.Module:
    """Build the named model; the factory must return an nn.Module. in_features > 0: table rows of that width
    (passed to the factory as in_features=; image-only factories need not take it); `sizes`: gpt's size flags."""
    extra = {"in_features": in_features} if in_features else {}
    extra.update(sizes or {})
    model = resolve_factory(name)(num_classes=num_classes, image_size=image_size, **extra)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model factory {name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model
