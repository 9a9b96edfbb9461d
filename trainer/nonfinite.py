"""A NaN or inf loss stops the run, on every rank in the same step, before it touches the weights.

How every rank learns of it without a collective of its own: a rank whose micro-batch loss is not
finite backpropagates `carried(loss)`, which is NaN times the loss, so its gradients are NaN; DDP's
gradient all-reduce (the one every step already runs) then hands NaN gradients to every rank. After
the last micro-batch each rank checks its (all-reduced, so identical) gradients, before the
optimizer step: non-finite -> NonFiniteStep, naming the step, the rank and its samples, and the
trainer exits 1 (trainer/__main__.py). The weights of the last finite step stay as they were, and
no checkpoint is stored from non-finite weights (`weights_finite`). A grad scaler that is on
(fp16) skips inf-gradient steps itself: then only the loss is checked.

metrics.jsonl, spikes.jsonl and summary.json stay valid JSON (`finite_json`): a non-finite number
is written as null, with a `KEY_nonfinite` field beside it saying "nan", "inf" or "-inf".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

NAMED_SAMPLES = 8  # the keys a stop message names per rank (the rest are counted)


class NonFiniteStep(RuntimeError):
    """A step's loss or gradients are NaN or inf: the run stops before the optimizer step."""


def carried(loss: torch.Tensor) -> torch.Tensor:
    """`loss`, or NaN-valued with NaN gradients when it is not finite: the flag rides DDP's all-reduce.
    No host sync: the choice is made on the device."""
    nan = torch.full_like(loss, math.nan)
    return loss * torch.where(torch.isfinite(loss), torch.ones_like(loss), nan)


def grad_norm(model: nn.Module) -> float:
    """The global L2 norm of `model`'s gradients (one host sync); 0.0 when there are none."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))


def check_step(*, step: int, rank: int, loss: float, model: nn.Module, keys: Sequence[str],
               grads_checked: bool = True) -> None:
    """Before the optimizer step: NonFiniteStep when this rank's loss or the (all-reduced) gradients
    are not finite, naming the step, this rank and its samples."""
    norm = grad_norm(model) if grads_checked else 0.0
    if math.isfinite(loss) and math.isfinite(norm):
        return
    named = ", ".join(keys[:NAMED_SAMPLES]) + (f" and {len(keys) - NAMED_SAMPLES} more" if len(keys) > NAMED_SAMPLES
                                               else "")
    samples = f"its samples: {named}" if keys else "its samples are named with --record-keys (token runs)"
    if not math.isfinite(loss):
        what = f"the loss is {loss} on rank {rank} ({samples})"
    else:
        what = (f"the gradient norm is {norm} after the all-reduce, while rank {rank}'s loss {loss:.4g} is finite "
                f"(another rank's loss is not: its line names it; or a backward overflowed; {samples})")
    raise NonFiniteStep(f"step {step}: {what}. Stopped before the optimizer step: the weights are step "
                        f"{step - 1}'s and no checkpoint holds non-finite weights. Lower --lr (or raise "
                        "--warmup-steps), then resume from the last checkpoint (--resume auto)")


def weights_finite(model: nn.Module) -> str | None:
    """None when every parameter is finite, else the name of the first one that is not."""
    for name, p in model.named_parameters():
        if not bool(torch.isfinite(p).all()):
            return name
    return None


def refused_save(run: Any) -> bool:
    """True, warned and recorded (checkpoint_refused), when one of the run's weights is NaN or inf: such a
    checkpoint is never stored, so `--resume auto` never meets one (rank 0, in trainer.train.save)."""
    bad = weights_finite(run.model)
    if bad is None:
        return False
    run.recorder.event({"kind": "checkpoint_refused", "step": run.step, "epoch": run.epoch, "parameter": bad})
    run.recorder.warn(f"checkpoint at step {run.step} NOT stored: parameter {bad} holds NaN or inf (last stored: "
                      f"{'none' if run.last_saved_step < 0 else f'step {run.last_saved_step}'})")
    return True


def finite_json(value: Any) -> Any:
    """`value` with every non-finite float replaced by None, and `KEY_nonfinite` ("nan", "inf", "-inf")
    added beside a dict key that held one: json.dumps(allow_nan=False) then writes it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            out[k] = finite_json(v)
            if isinstance(v, float) and not math.isfinite(v):
                out[f"{k}_nonfinite"] = str(v)
        return out
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value
