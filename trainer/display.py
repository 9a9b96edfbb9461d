"""Rank 0's terminal output: a live table of log intervals and the final summary table (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from trainer.report import STAGE_LABELS
from trainer.scaling.cost import describe
from trainer.timing import PHASES

_COLUMNS = ("step", "epoch", "loss", "lr", "samples/s", "data wait", "hidden load", "slowest stage",
            "slowest rank")

_MIX = "mix observed/requested"


def mix_cell(sources: list[dict[str, Any]]) -> str:
    """'web 70%/70% gold 10%/10%': each source's observed share of the interval vs its requested one."""
    return " ".join(f"{short(s['source'])} {s['observed']:.0%}/{s['requested']:.0%}" for s in sources)


def short(url: str) -> str:
    """The last path part of a source URL, for narrow cells."""
    return url.rstrip("/").rsplit("/", 1)[-1] or url


class LiveTable:
    """Interval rows, redrawn in place on a terminal; printed one per line when piped."""

    def __init__(self, console: Console, *, live: bool, keep_rows: int = 15, tokens: bool = False) -> None:
        self.console, self.keep_rows = console, keep_rows
        # A token run's rate column is tokens/s (its samples are sequences of seq_len tokens).
        self.columns = tuple("tokens/s" if c == "samples/s" else c for c in _COLUMNS) if tokens else _COLUMNS
        self.rows: list[tuple[str, ...]] = []
        self._live = Live(self._table(), console=console, auto_refresh=False) if live and console.is_terminal else None
        if self._live is not None:
            self._live.start()

    def _table(self) -> Table:
        table = Table(title="training (all ranks gathered per interval)")
        mixed = any(len(row) > len(self.columns) for row in self.rows)
        for name in self.columns + ((_MIX,) if mixed else ()):
            table.add_column(name, justify="right")
        for row in self.rows[-self.keep_rows:]:
            table.add_row(*row)
        return table

    def add(self, rep: dict[str, Any], *, step: int, epoch: int, loss: float, lr: float) -> None:
        row = (str(step), str(epoch), f"{loss:.4f}", f"{lr:.2e}", rate_cell(rep),
               f"{rep['wait_share']:.1%}", f"{rep['hidden_load_share']:.0%}",
               STAGE_LABELS[rep["slowest_stage"]],
               f"r{rep['slowest_rank']} {rep['slowest_rank_vs_median']:.2f}x")
        if rep.get("sources"):  # a mixture: each source's observed share / requested share
            row += (mix_cell(rep["sources"]),)
        self.rows.append(row)
        if self._live is not None:
            self._live.update(self._table(), refresh=True)
        else:
            self.console.print("  ".join(f"{c}={v}" for c, v in zip(self.columns + (_MIX,), row, strict=False)))

    def note(self, text: str) -> None:
        self.console.print(text)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def rate_cell(row: dict[str, Any]) -> str:
    """The rate of a report or rank row: tokens/s for a token run, else samples/s."""
    return f"{row['tokens_per_s']:,.0f}" if "tokens_per_s" in row else f"{row['samples_per_s']:.1f}"


def summary_table(rep: dict[str, Any], *, title: str) -> Table:
    """Per rank: samples/s (tokens/s for a token run), time per step in each stage, data-wait share,
    hidden loading."""
    table = Table(title=title)
    table.add_column("rank", justify="right", no_wrap=True)
    table.add_column("tokens/s" if "tokens_per_s" in rep else "samples/s", justify="right")
    for p in PHASES:
        table.add_column(f"{STAGE_LABELS[p]} ms/step", justify="right")
    table.add_column("step ms", justify="right")
    table.add_column("comm overlapped* ms", justify="right")
    table.add_column("data wait", justify="right")
    table.add_column("load hidden", justify="right")
    for r in rep["ranks"]:
        n = max(1, r["steps"])
        cells = [f"{1000 * r[f'{p}_s'] / n:.1f}" for p in PHASES]
        mark = " (slowest)" if r["rank"] == rep["slowest_rank"] and rep["world_size"] > 1 else ""
        table.add_row(f"{rank_label(r, rep)}{mark}", rate_cell(r), *cells,
                      f"{1000 * r['step_s'] / n:.1f}", f"{1000 * r['comm_overlapped_s'] / n:.1f}",
                      f"{r['wait_share']:.1%}", f"{r['hidden_load_share']:.0%}")
    table.caption = ("* comm overlapped ran during forward+backward and is already inside it: "
                     "do not add it to the step. step = stages + bookkeeping.")
    return table


def sources_table(sources: list[dict[str, Any]]) -> Table:
    """A mixture's sources over the run: samples, samples/s, observed vs requested share."""
    table = Table(title="mixture: observed vs requested share of real samples (all ranks)")
    for name in ("source", "samples", "samples/s", "observed", "requested"):
        table.add_column(name, justify="left" if name == "source" else "right")
    for s in sources:
        table.add_row(s["source"], str(s["samples"]), f"{s['samples_per_s']:.1f}", f"{s['observed']:.1%}",
                      f"{s['requested']:.1%}")
    return table


def rank_label(row: dict[str, Any], rep: dict[str, Any]) -> str:
    """'3', or '3 (node 1, local 0)' when the job spans more than one node."""
    nodes = {r.get("node", 0) for r in rep["ranks"]}
    if len(nodes) < 2:
        return str(row["rank"])
    return f"{row['rank']} (node {row.get('node', 0)}, local {row.get('local_rank', 0)})"


def checkpoints_line(facts: dict[str, Any]) -> str:
    """'checkpoints: 2 stored, 3 failed in this run; newest resumable: step 4 (DIR)'."""
    last = facts["last_stored_step"]
    newest = "NONE, nothing can be resumed" if last is None else f"step {last}"
    return (f"checkpoints: {facts['stored']} stored, {facts['failed']} failed in this run; newest resumable: "
            f"{newest} ({facts['dir']})")


def print_summary(console: Console, rep: dict[str, Any], *, outputs: dict[str, str],
                  val: dict[str, float] | None) -> None:
    """The final summary: table, global line, verdict, validation, where the files are."""
    console.print(summary_table(rep, title=f"overlap summary: {rep['steps']} steps x {rep['world_size']} ranks"))
    rate = (f"{rep['tokens_per_s']:,.0f} tokens/s ({rep['samples_per_s']:.1f} sequences/s of "
            f"{rep['tokens_per_sample']} tokens)" if "tokens_per_s" in rep else f"{rep['samples_per_s']:.1f} samples/s")
    console.print(f"global: {rate} | data wait {rep['wait_share']:.1%} of step time"
                  f" | loading hidden {rep['hidden_load_share']:.0%} | slowest stage "
                  f"{STAGE_LABELS[rep['slowest_stage']]} | slowest rank {rep['slowest_rank']} "
                  f"({rep['slowest_rank_vs_median']:.2f}x median)")
    console.print(f"verdict: {rep['verdict']}")
    job = rep.get("job", {})
    if job.get("loader_plan") or job.get("accel"):
        console.print(f"loader: {job.get('loader_plan', '?')} | model: {job.get('accel', '?')}")
    if rep.get("gpu_decode"):
        console.print("gpu decode: " + ", ".join(f"{k} {v:,.0f}" if isinstance(v, float) and v > 1 else f"{k} {v}"
                                                 for k, v in rep["gpu_decode"].items()))
    if rep.get("sources"):
        console.print(sources_table(rep["sources"]))
    if rep.get("cost"):
        console.print(describe(rep["cost"]))
    if rep.get("checkpoints"):
        console.print(checkpoints_line(rep["checkpoints"]))
    for skip in rep.get("skipped", ()):
        console.print(f"skipped: {skip['text']}")
    if val:
        console.print(f"validation: loss {val['loss']:.4f}, accuracy {val['accuracy']:.2%} "
                      f"over {val['samples']} samples")
    for name, path in outputs.items():
        console.print(f"{name}: {path}")
