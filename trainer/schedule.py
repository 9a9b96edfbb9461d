"""Warmup + cosine learning-rate schedule driven by samples seen, so it survives a world-size change.

Progress is samples trained / samples planned (epochs x the epoch's size at the first start),
not optimizer steps: after a resume at another world size each step is bigger or smaller, but
the LR at a given point of the data is the same. --warmup-steps is converted to samples once,
at the first start's global batch, and saved. A resume with another --epochs or --max-steps
replans: the cosine then spans the new total, counted on from the samples already seen.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def planned_samples(*, epochs: int, epoch_samples: int, max_steps: int, step: int, samples_seen: int,
                    global_batch: int) -> int:
    """Samples trained when the run ends: --epochs x the epoch's size, or fewer where --max-steps
    (optimizer steps in total) comes first, its remaining steps at this start's global batch."""
    total = epochs * epoch_samples
    if max_steps:
        total = min(total, samples_seen + max(0, max_steps - step) * global_batch)
    return total


class WarmupCosine:
    """Sets each param group's lr from samples seen: linear warmup, then cosine to base_lr * min_ratio."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, base_lr: float, total_samples: int,
                 warmup_samples: int, min_ratio: float) -> None:
        self.optimizer, self.base_lr, self.min_ratio = optimizer, base_lr, min_ratio
        self.total_samples, self.warmup_samples = max(1, total_samples), warmup_samples
        self.samples_seen = 0
        self._apply()

    def lr_at(self, samples: int) -> float:
        if samples < self.warmup_samples:
            return self.base_lr * (samples + 1) / (self.warmup_samples + 1)
        span = max(1, self.total_samples - self.warmup_samples)
        progress = min(1.0, (samples - self.warmup_samples) / span)
        return self.base_lr * (self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))

    @property
    def lr(self) -> float:
        return self.lr_at(self.samples_seen)

    def step(self, samples: int) -> None:
        """Account for `samples` trained (all ranks together) and set the next lr."""
        self.samples_seen += samples
        self._apply()

    def replan(self, total_samples: int) -> tuple[float, float]:
        """Let the cosine end at `total_samples` instead, from the samples already seen; (lr before, lr after)."""
        before = self.lr
        self.total_samples = max(1, total_samples)
        self._apply()
        return before, self.lr

    def _apply(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr

    def state_dict(self) -> dict[str, Any]:
        return {"samples_seen": self.samples_seen, "total_samples": self.total_samples,
                "warmup_samples": self.warmup_samples, "base_lr": self.base_lr, "min_ratio": self.min_ratio}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # The saved plan (total, warmup) stands, so the curve over the data stays the same at another
        # world size; the trainer calls `replan` when the run's length itself changed.
        self.samples_seen, self.total_samples = int(state["samples_seen"]), int(state["total_samples"])
        self.warmup_samples = int(state["warmup_samples"])
        self._apply()


def replan(run: Any, saved: dict[str, Any], *, at_max: bool) -> None:
    """After loading the schedule: another --epochs or --max-steps than the checkpoint's config replans
    the cosine for the new total from the samples already seen, and the change of lr is logged
    (stderr and metrics.jsonl). The same lengths keep the saved plan (a new world size changes nothing).
    `run`: the trainer's Run, its schedule loaded; `at_max`: --max-steps already reached."""
    cfg, sched = run.cfg, run.schedule
    was, now = (saved.get("epochs"), saved.get("max_steps")), (cfg.epochs, cfg.max_steps)
    left = run.epoch < cfg.epochs and not at_max
    if was != now:
        global_batch = run.rt.world_size * cfg.batch_size * cfg.grad_accum
        old_total = sched.total_samples
        total = planned_samples(epochs=cfg.epochs, epoch_samples=run.steps_per_epoch * global_batch,
                                max_steps=cfg.max_steps, step=run.step, samples_seen=sched.samples_seen,
                                global_batch=global_batch)
        old_lr, new_lr = sched.replan(total)
        if run.rt.is_main:
            run.recorder.event({"kind": "schedule", "step": run.step, "samples_seen": sched.samples_seen,
                                "old_total_samples": old_total, "new_total_samples": sched.total_samples,
                                "old_lr": old_lr, "new_lr": new_lr, "old_epochs": was[0], "epochs": now[0],
                                "old_max_steps": was[1], "max_steps": now[1]})
            changed = ", ".join(f"--{flag} {a} -> {b}" for flag, a, b in zip(("epochs", "max-steps"), was, now)
                                if a != b)
            run.recorder.warn(f"schedule replanned at the resume ({changed}): the cosine now ends at sample "
                              f"{sched.total_samples} (was {old_total}; {sched.samples_seen} seen); lr at the "
                              f"resume {old_lr:.3e} -> {new_lr:.3e}")
    elif left and sched.samples_seen >= sched.total_samples and run.rt.is_main:
        run.recorder.warn(f"the schedule ended at sample {sched.total_samples} ({sched.samples_seen} seen): the "
                          f"rest of this run trains at its final lr {sched.lr:.3e} (--min-lr-ratio "
                          f"{cfg.min_lr_ratio:g})")
