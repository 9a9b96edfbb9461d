"""The all-reduce levers: torch's DDP communication hooks by name, composed with the timing hook.

`--comm-hook none` keeps the timing hook's own all-reduce (mean); fp16 / bf16 compress each
bucket to half the bytes on the wire; powersgd sends low-rank factors (torch's PowerSGD, rank 1,
error feedback). A "package.module:function" names a factory returning (state, hook), e.g. a hook
that adds a known delay in tests. Whatever the hook, StepTimer's wrapper times its future, so the
report still splits exposed and overlapped comm.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

WIRE_RATIO = {"none": 1.0, "fp16": 0.5, "bf16": 0.5}  # bytes on the wire per gradient byte (fp32 grads)


def build(name: str, *, process_group: Any = None) -> tuple[Any, Callable[..., Any] | None]:
    """(state, hook) for `name`; hook None means the timing hook's plain all-reduce."""
    if name == "none":
        return None, None
    if name == "fp16":
        return process_group, default_hooks.fp16_compress_hook
    if name == "bf16":
        return process_group, default_hooks.bf16_compress_hook
    if name == "powersgd":
        # Two plain steps first: error feedback starts from real gradients (torch's advice, kept short).
        state = powerSGD_hook.PowerSGDState(process_group=process_group, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2)
        return state, powerSGD_hook.powerSGD_hook
    if ":" not in name:
        raise ValueError(f"unknown --comm-hook {name!r}")
    module_name, _, attr = name.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--comm-hook {name!r}: cannot load it ({exc})") from None
    state, hook = factory()
    if not callable(hook):
        raise ValueError(f"--comm-hook {name!r} must return (state, hook) with a callable hook")
    return state, hook


def check(name: str, *, device: str, gradient_bytes: int, bucket_cap_mb: float) -> None:
    """Refuse what cannot work: PowerSGD chains its all-reduces in future callbacks, and with more
    than one bucket gloo (CPU) then runs them in a different order on each rank (a size mismatch)."""
    one_bucket = min(bucket_cap_mb, 1.0) * 2**20  # DDP's first bucket holds at most 1 MB
    if name == "powersgd" and device == "cpu" and gradient_bytes > one_bucket:
        raise ValueError(f"--comm-hook powersgd on CPU (gloo) needs one gradient bucket, but the model has "
                         f"{gradient_bytes / 2**20:.2f} MB of gradients (first bucket <= {one_bucket / 2**20:.2f} MB);"
                         " use fp16/bf16 on CPU, or powersgd on GPUs (NCCL)")


def grad_bytes(model: nn.Module) -> int:
    """Bytes of gradient DDP reduces per step: every trainable parameter, in its own dtype."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def wire_bytes(name: str, state: Any, gradient_bytes: int) -> float | None:
    """Bytes each rank puts into the all-reduce per step for hook `name`; None when unknown."""
    if name in WIRE_RATIO:
        return gradient_bytes * WIRE_RATIO[name]
    if name == "powersgd" and isinstance(state, powerSGD_hook.PowerSGDState):
        _, before, after = state.compression_stats()  # element counts of the last compressed step
        if before > 0:
            return gradient_bytes * after / before
    return None
