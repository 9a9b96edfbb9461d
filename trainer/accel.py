"""How the model runs on its device, as GPU users run it: autocast precision (a gradient scaler for
fp16), channels-last memory order, torch.compile. Built once per run from the network group."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}
# torch.compile's backend: inductor generates kernels (on CPU it compiles C++ with the system compiler,
# minutes for a first step on a busy machine); the CPU tests use "eager", which traces with dynamo only.
COMPILE_BACKEND = "inductor"


@dataclass(frozen=True, kw_only=True, slots=True)
class Accel:
    """One run's precision and memory order; `autocast()` around forward passes, `scaler()` for backward."""

    device_type: str
    precision: str  # bf16 | fp16 | fp32 (auto resolved)
    channels_last: bool = False
    compile: bool = False

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Forward passes under this: autocast to the run's dtype, nothing for fp32."""
        dtype = DTYPES[self.precision]
        return contextlib.nullcontext() if dtype is None else torch.autocast(self.device_type, dtype=dtype)

    def scaler(self) -> torch.amp.GradScaler:
        """fp16 gradients underflow without loss scaling; bf16 and fp32 get a disabled (pass-through) scaler."""
        return torch.amp.GradScaler(self.device_type, enabled=self.precision == "fp16")

    def model(self, model: nn.Module) -> nn.Module:
        """The model in the run's memory order (weights of 4-D convolutions NHWC with channels_last)."""
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """A batch of images [N, C, H, W] in the model's memory order; other inputs as they are."""
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last and x.dim() == 4 else x

    def compiled(self, net: nn.Module) -> nn.Module:
        """`net` (DDP-wrapped when distributed: compiled around DDP, its comm hook kept) compiled with
        --compile; checkpoints and validation keep the plain model."""
        return torch.compile(net, backend=COMPILE_BACKEND) if self.compile else net

    def describe(self) -> str:
        """One line for the report: 'bf16 autocast, channels-last, compiled'."""
        parts = [f"{self.precision} autocast" if DTYPES[self.precision] is not None else "fp32"]
        if self.precision == "fp16":
            parts[0] += " + grad scaler"
        parts += ["channels-last"] * self.channels_last + [f"torch.compile ({COMPILE_BACKEND})"] * self.compile
        return ", ".join(parts)


def accel_of(network: Any, device: torch.device) -> Accel:
    """The run's Accel from the network group (precision, channels_last, compile) on `device`; ValueError
    when this torch or device cannot run the precision asked for (auto: bf16 on CUDA, fp32 elsewhere)."""
    precision = network.precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    if DTYPES[precision] is not None:
        from torch.amp.autocast_mode import is_autocast_available

        if not is_autocast_available(device.type):
            raise ValueError(f"--precision {precision}: this torch has no autocast on {device.type}; "
                             "use --precision fp32")
        if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError(f"--precision bf16: {torch.cuda.get_device_name(device)} has no bf16; "
                             "use --precision fp16 (with a gradient scaler) or fp32")
    return Accel(device_type=device.type, precision=precision, channels_last=network.channels_last,
                 compile=network.compile)
