"""Everything the run writes: per-step keys, gathered interval reports, metrics.jsonl, trace, chart, summary.

Every rank calls `step()` for every step (the gathers at log intervals are collectives);
only rank 0 prints and writes the shared files. keys-rankR.jsonl is written by each rank.
"""

from __future__ import annotations

import glob
import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from trainer import runtime, spikes
from trainer.config import TrainConfig, config_dict, config_secrets
from trainer.display import LiveTable, print_summary
from trainer.nonfinite import finite_json
from trainer.redaction import scrub
from trainer.report import combine, metrics_line, source_rows, summarize
from trainer.scaling import cost
from trainer.timing import StepRecord
from trainer.trace import write_chart, write_trace

_SUM_KEYS = ("steps", "step_s", "wait_s", "h2d_s", "compute_s", "comm_exposed_s", "comm_overlapped_s",
             "opt_s", "read_s", "decode_s", "samples", "hidden_load_s")


class Recorder:
    """Collects one rank's step records; reports at every --log-every steps and at the end."""

    def __init__(self, cfg: TrainConfig, rt: runtime.Runtime, *, secrets: tuple[str, ...] = ()) -> None:
        self.cfg, self.rt = cfg, rt
        # Everything this recorder writes or prints passes scrub with these (the URLs' and the storage
        # options' credentials): metrics.jsonl, summary.json, notes, the printed summary.
        self.secrets = tuple(dict.fromkeys((*config_secrets(cfg), *secrets)))
        os.makedirs(cfg.out, exist_ok=True)
        self.interval: list[StepRecord] = []
        self.total: dict[str, Any] | None = None  # sums over the run, the first step of each start excluded
        self.trace: list[dict[str, Any]] = []
        self.first: dict[str, Any] | None = None  # the first step's sums: start-up, used only if alone
        self.last_loss = 0.0
        self.job: dict[str, Any] = {}  # facts of the job for summary.json (set by setup/wrap): bytes, sizes
        self.unwritable: set[str] = set()  # files a full or read-only disk refused (reported once each)
        self.checkpoints: dict[str, Any] | None = None  # stored / failed counts for the summary (set by train)
        self.wire_bytes: Callable[[], float | None] = lambda: None
        # The loader's GPU decode facts (decode gpu/auto: codec, split, each side's rate; set by setup).
        self.gpu_decode: Callable[[], dict[str, Any] | None] = lambda: None
        # Where this rank runs, in every gathered row: the report names ranks by node and local rank.
        self.where = {"node": rt.node_rank, "local_rank": rt.local_rank, "host": socket.gethostname()}
        self.tensorboard = None
        if rt.is_main and cfg.tensorboard:
            from trainer.tensorboard import TensorBoardSink

            self.tensorboard = TensorBoardSink(cfg.tensorboard)
        # A mixture's sources (set by setup): names, requested shares, real samples per source.
        self.source_names: list[str] = []
        self.requested: list[float] = []
        self.source_interval: list[int] = []
        self.source_total: list[int] = []
        self.keys_path = os.path.join(cfg.out, f"keys-rank{rt.rank}.jsonl")
        # Loss spikes (trainer/spikes.py): this rank's since the last report; rank 0 names their samples
        # with spike_keys(step, ranks) (set by setup) and keeps every merged row for the summary.
        self.spikes: list[dict[str, Any]] = []
        self.spike_keys: Callable[[int, list[int]], dict[str, list[str]] | None] | None = None
        self.spike_rows: list[dict[str, Any]] = []
        self.skips: list[dict[str, Any]] = []  # --skip-steps / --skip-samples at this start (trainer/skipping.py)
        # Piped output (CI logs, tests) gets wide tables instead of rich's 80-column default, and lines
        # of text are never wrapped (soft_wrap): a log line stays one line, whatever its length.
        self.console = (Console() if sys.stdout.isatty() else Console(width=150, soft_wrap=True)) if rt.is_main else None
        # A token run (--model gpt) reports tokens: a sample is a sequence of seq_len tokens of input.
        self.tokens_per_sample = cfg.seq_len if cfg.model == "gpt" else None
        self.table = (LiveTable(self.console, live=cfg.live, tokens=self.tokens_per_sample is not None)
                      if self.console is not None else None)
        if rt.is_main:
            self.event({"kind": "start", "time": time.time(), "world_size": rt.world_size,
                        "device": str(rt.device), "config": config_dict(cfg)})

    # --- files ---------------------------------------------------------------------------------
    def event(self, record: dict[str, Any]) -> None:
        """Append one record to metrics.jsonl (rank 0 only), credentials redacted."""
        if self.rt.is_main:
            line = json.dumps(finite_json(scrub(record, self.secrets)), allow_nan=False) + "\n"
            self._saving(os.path.join(self.cfg.out, "metrics.jsonl"), lambda path: _append(path, line))

    def _saving(self, path: str, write: Callable[[str], None]) -> None:
        """write(path); a disk that is full or read-only (often the checkpoints' disk too) is reported
        once per file on stderr, and training goes on without that record."""
        try:
            write(path)
        except OSError as exc:
            if path not in self.unwritable:
                self.unwritable.add(path)
                print(f"trainer: cannot write {path} ({exc.strerror or exc}); training goes on without it",
                      file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        """A line on rank 0's console and in metrics.jsonl, credentials redacted."""
        text = scrub(text, self.secrets)
        if self.table is not None:
            self.table.note(text)
        self.event({"kind": "note", "text": text})

    def warn(self, text: str) -> None:
        """A note that also goes to stderr (rank 0): something the user must not miss."""
        self.note(text)
        if self.rt.is_main:
            print(f"trainer: {scrub(text, self.secrets)}", file=sys.stderr, flush=True)

    def truncate_keys(self, step: int) -> None:
        """Keep only committed steps (<= step) in every rank's key file (rank 0, before training starts)."""
        if not self.cfg.record_keys:
            return
        for path in glob.glob(os.path.join(self.cfg.out, "keys-rank*.jsonl")):
            kept = []
            with open(path) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line cut short by a killed rank
                    if rec["step"] <= step:
                        kept.append(line if line.endswith("\n") else line + "\n")
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                f.writelines(kept)
            os.replace(tmp, path)

    # --- per step ------------------------------------------------------------------------------
    def set_sources(self, names: list[str], requested: list[float]) -> None:
        """Report per-source samples/s and observed vs requested shares (a mixture's loader)."""
        self.source_names, self.requested = list(names), list(requested)
        self.source_interval, self.source_total = [0] * len(names), [0] * len(names)

    def count_sources(self, source: Any, mask: Any) -> None:
        """Add a batch's real samples per source (`source`: the batch's int64 source index [N])."""
        if not self.source_names:
            return
        counts = source[mask.cpu()].bincount(minlength=len(self.source_names)).tolist()
        for i, c in enumerate(counts[:len(self.source_names)]):
            self.source_interval[i] += c
            self.source_total[i] += c

    def step(self, rec: StepRecord, loss: float, keys: list[str], *, lr: float) -> None:
        """Record one step; at a log interval gather all ranks and report (a collective)."""
        if self.cfg.record_keys:
            line = json.dumps({"step": rec.step, "epoch": rec.epoch, "keys": keys}) + "\n"
            self._saving(self.keys_path, lambda path: _append(path, line))
        self.interval.append(rec)
        if rec.slices:
            self.trace.append({**rec.as_dict(), "slices": rec.slices})
        if self.first is None:
            self.first = {**summarize([rec], rank=self.rt.rank), **self.where}
        else:
            self.total = _add(self.total, {**summarize([rec], rank=self.rt.rank), **self.where})
        self.last_loss = loss
        if rec.step % self.cfg.log_every == 0:
            self._report(rec.step, rec.epoch, lr)

    def _report(self, step: int, epoch: int, lr: float) -> None:
        mine = {**summarize(self.interval, rank=self.rt.rank), **self.where}
        mine["loss"] = self.last_loss
        mine["source_samples"], self.source_interval = self.source_interval, [0] * len(self.source_names)
        mine["spikes"], self.spikes = self.spikes, []
        gathered = runtime.gather(self.rt, mine)
        self.interval = []
        if not self.rt.is_main:
            return
        self._name_spikes([g.pop("spikes") for g in gathered])
        rep = combine(gathered, num_workers=self.cfg.num_workers, decode=self.cfg.decode,
                      tokens_per_sample=self.tokens_per_sample, gpu_decode=self.gpu_decode())
        if self.source_names:
            rep["sources"] = source_rows(gathered, names=self.source_names, requested=self.requested,
                                         samples_per_s=rep["samples_per_s"])
        loss = sum(g["loss"] for g in gathered) / len(gathered)
        self.event(metrics_line(rep, step=step, epoch=epoch, loss=loss, lr=lr))
        assert self.table is not None
        self.table.add(rep, step=step, epoch=epoch, loss=loss, lr=lr)
        if self.tensorboard is not None:
            self.tensorboard.interval(rep, step=step, loss=loss, lr=lr)

    def _name_spikes(self, gathered: list[list[dict[str, Any]]]) -> None:
        """Rank 0: merge the ranks' spikes by step, name their samples from the plan, and write each
        to spikes.jsonl, metrics.jsonl and the console."""
        for row in spikes.merge(gathered):
            try:
                row["keys"] = self.spike_keys(row["step"], row["ranks"]) if self.spike_keys else None
            except Exception as exc:  # noqa: BLE001 - naming the samples must never stop training
                row["keys"], row["keys_error"] = None, f"{type(exc).__name__}: {exc}"
            row = scrub(row, self.secrets)
            self.spike_rows.append(row)
            line = json.dumps(finite_json(row), allow_nan=False) + "\n"
            self._saving(os.path.join(self.cfg.out, "spikes.jsonl"), lambda path: _append(path, line))
            self.event({"kind": "spike", **row})
            losses, medians = row["loss"].values(), [m for m in row["median"].values() if m is not None]
            loss = next((v for v in losses if not math.isfinite(v)), max(losses))  # a NaN or inf first
            median = f"{max(medians):.4g}" if medians else f"not yet: under {spikes.MIN_STEPS} steps"
            self.note(f"loss spike at step {row['step']} on rank(s) {row['ranks']}: {loss:.4g} (median "
                      f"{median}); its samples are in spikes.jsonl")

    def validation(self, val: dict[str, float], *, step: int, epoch: int) -> None:
        self.event({"kind": "validation", "step": step, "epoch": epoch, **val})
        if self.tensorboard is not None:
            self.tensorboard.validation(val, step=step)
        if self.table is not None:
            self.table.note(f"validation after epoch {epoch}: loss {val['loss']:.4f}, "
                            f"accuracy {val['accuracy']:.2%} ({val['samples']} samples)")

    # --- the end -------------------------------------------------------------------------------
    def finish(self, val: dict[str, float] | None) -> dict[str, Any] | None:
        """Gather totals and traces; rank 0 writes trace.json, the chart, summary.json and prints."""
        total = self.total or self.first or {**summarize([], rank=self.rt.rank), **self.where}
        total = {**total, "source_samples": self.source_total, "spikes": self.spikes}
        totals = runtime.gather(self.rt, total)
        if self.rt.is_main:
            self._name_spikes([t.pop("spikes") for t in totals])
        traces = runtime.gather(self.rt, self.trace)
        if self.table is not None:
            self.table.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if not self.rt.is_main:
            return None
        if not any(t["steps"] for t in totals) and self.first is None:
            self.note(f"nothing left to train (--epochs {self.cfg.epochs}, --max-steps {self.cfg.max_steps}); "
                      "earlier outputs in --out are kept")
            return None
        rep = combine(totals, num_workers=self.cfg.num_workers, decode=self.cfg.decode,
                      tokens_per_sample=self.tokens_per_sample, gpu_decode=self.gpu_decode())
        if self.source_names:
            rep["sources"] = source_rows(totals, names=self.source_names, requested=self.requested,
                                         samples_per_s=rep["samples_per_s"])
        out = self.cfg.out
        outputs = {"metrics": os.path.join(out, "metrics.jsonl"), "trace (ui.perfetto.dev)": os.path.join(out, "trace.json"),
                   "chart": os.path.join(out, "steps.png"), "summary": os.path.join(out, "summary.json")}
        self._saving(outputs["trace (ui.perfetto.dev)"], lambda path: write_trace(path, traces))
        self._saving(outputs["chart"], lambda path: write_chart(path, traces))
        rep["job"] = {**self.job, "wire_bytes": self.wire_bytes(), "world_size": self.rt.world_size,
                      "num_nodes": len({t["node"] for t in totals}), "tokens_per_sample": self.tokens_per_sample}
        if self.cfg.price_per_hour and rep["samples_per_s"] > 0:
            rep["cost"] = cost.cost_of(price_per_hour=self.cfg.price_per_hour, world_size=self.rt.world_size,
                                       samples_per_s=rep["samples_per_s"],
                                       epoch_samples=int(self.job.get("epoch_samples", 0)),
                                       wasted_share=cost.wasted_share(rep["stage_share"]),
                                       tokens_per_sample=self.tokens_per_sample)
        if self.checkpoints is not None:
            rep["checkpoints"] = self.checkpoints
        if self.spike_rows:
            rep["spikes"] = self.spike_rows
        if self.skips:
            rep["skipped"] = self.skips
        rep = scrub(rep, self.secrets)
        final = {"kind": "summary", **{k: v for k, v in rep.items()}, "validation": val}
        self._saving(outputs["summary"], lambda path: _dump(path, final))
        self.event(final)
        assert self.console is not None
        print_summary(self.console, rep, outputs=outputs, val=val)
        return rep


def _append(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def _dump(path: str, record: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(finite_json(record), f, indent=1, allow_nan=False)


def _add(total: dict[str, Any] | None, part: dict[str, Any]) -> dict[str, Any]:
    if total is None:
        return dict(part)
    out = dict(total)
    for key in _SUM_KEYS:
        out[key] = total[key] + part[key]
    return out
