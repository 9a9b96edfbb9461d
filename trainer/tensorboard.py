"""`--tensorboard DIR`: the report's interval metrics as TensorBoard scalars (rank 0 writes).

Uses torch.utils.tensorboard, which needs the `tensorboard` package (`pip install "shardify[tensorboard]"`).
Tags: train/{samples_per_s, data_wait_share, loss, lr, exposed_comm_share}, stage_ms/{stage}/rank{R}
(milliseconds per step in each stage, per rank), val/{loss, accuracy}. The x axis is the optimizer step.
"""

from __future__ import annotations

from typing import Any

from trainer.timing import PHASES


class TensorBoardSink:
    """Writes one event file under `logdir`; flushes at every interval so a running job can be watched."""

    def __init__(self, logdir: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ValueError(f"--tensorboard needs the tensorboard package: pip install tensorboard ({exc})") from None
        self.writer = SummaryWriter(log_dir=logdir)

    def interval(self, rep: dict[str, Any], *, step: int, loss: float, lr: float) -> None:
        w = self.writer
        w.add_scalar("train/samples_per_s", rep["samples_per_s"], step)
        if "tokens_per_s" in rep:  # a token run
            w.add_scalar("train/tokens_per_s", rep["tokens_per_s"], step)
        w.add_scalar("train/data_wait_share", rep["wait_share"], step)
        w.add_scalar("train/exposed_comm_share", rep["stage_share"]["comm_exposed"], step)
        w.add_scalar("train/loss", loss, step)
        w.add_scalar("train/lr", lr, step)
        for r in rep["ranks"]:
            n = max(1, r["steps"])
            for p in PHASES:
                w.add_scalar(f"stage_ms/{p}/rank{r['rank']}", 1000.0 * r[f"{p}_s"] / n, step)
        w.flush()

    def validation(self, val: dict[str, float], *, step: int) -> None:
        self.writer.add_scalar("val/loss", val["loss"], step)
        self.writer.add_scalar("val/accuracy", val["accuracy"], step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
