"""`python -m trainer.scaling`: the same training at several world sizes, measured, predicted, priced.

    python -m trainer.scaling --nproc 1,2 --steps 30 --out runs/scaling -- --data DATASET [trainer flags]

Each world size is a real `torchrun --standalone` job of the trainer for --steps optimizer steps with
--threads torch threads per rank (OMP_NUM_THREADS too), so one rank never gets the whole machine
while each of two ranks gets half of it. Then an all-reduce sweep at 2 ranks fits the link, one
rank's input pipeline is timed alone (its ceiling), and the report (trainer/scaling/report.py) says
per world size: samples/s, efficiency, step-time shares, slowest rank, $; and predicts bigger jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.flags import parse_config


@dataclass(frozen=True, kw_only=True, slots=True)
class ScalingConfig:
    """What the scaling tool runs and how it judges; trainer flags travel separately."""

    nproc: tuple[int, ...] = (1, 2)
    threads: int = 1
    steps: int = 30
    out: str = "runs/scaling"
    sweep_flag: str = ""  # a trainer flag without dashes, e.g. comm-hook; empty: no sweep
    sweep_values: tuple[str, ...] = ()
    predict: tuple[int, ...] = (8, 64, 512)
    link_gbps: float | None = None
    link_latency_us: float | None = None
    storage_gbps: float | None = None
    price_per_hour: float | None = None
    deadline_hours: float | None = None
    epochs: int = 1
    min_efficiency: float = 0.8
    input_batches: int = 100
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.nproc or min(self.nproc) < 1 or min(self.predict, default=1) < 1:
            raise ValueError("--nproc and --predict need world sizes >= 1")
        if self.threads < 1 or self.steps < 3 or self.epochs < 1 or self.input_batches < 1:
            raise ValueError("--threads >= 1, --steps >= 3 (the first step is start-up), --epochs >= 1, please")
        if not 0 < self.min_efficiency <= 1:
            raise ValueError("--min-efficiency must be in (0, 1]")
        for name in ("link_gbps", "storage_gbps", "deadline_hours"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0")
        if self.price_per_hour is not None and self.price_per_hour < 0:
            raise ValueError("--price-per-hour must be >= 0")
        if self.sweep_flag and not self.sweep_values:
            raise ValueError("--sweep needs FLAG=V1,V2")


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def parse(argv: list[str]) -> tuple[ScalingConfig, list[str]]:
    """(the tool's config, the trainer flags after `--`); bad flags raise ValueError."""
    ours, trainer_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="python -m trainer.scaling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=_sizes, default=(1, 2), help="world sizes to run (default: 1,2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default: 1)")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps per run; the first is start-up")
    p.add_argument("--out", default="runs/scaling", help="scaling.json, scaling.png and one directory per run")
    p.add_argument("--sweep", default="", help="one trainer flag over values, e.g. comm-hook=none,fp16")
    p.add_argument("--predict", type=_sizes, default=(8, 64, 512), help="world sizes to predict")
    p.add_argument("--link-gbps", type=float, help="the target cluster's link, Gbit/s (else fitted at 2 ranks)")
    p.add_argument("--link-latency-us", type=float, help="its per-hop latency, microseconds (else fitted)")
    p.add_argument("--storage-gbps", type=float, help="aggregate storage bandwidth, Gbit/s, shared by all ranks")
    p.add_argument("--price-per-hour", type=float, help="$ per rank (accelerator) per hour")
    p.add_argument("--deadline-hours", type=float, help="name the smallest world size finishing --epochs in time")
    p.add_argument("--epochs", type=int, default=1, help="epochs the deadline is for")
    p.add_argument("--min-efficiency", type=float, default=0.8, help="below this the comm wall is hit")
    p.add_argument("--input-batches", type=int, default=100, help="batches timed for the input ceiling")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per run; the run is killed after it")
    p.exit_on_error = False
    try:
        ns = p.parse_args(ours)
    except argparse.ArgumentError as exc:
        raise ValueError(str(exc)) from None
    flag, _, values = ns.sweep.partition("=")
    cfg = ScalingConfig(nproc=ns.nproc, threads=ns.threads, steps=ns.steps, out=ns.out,
                        sweep_flag=flag.strip().lstrip("-"), sweep_values=tuple(v for v in values.split(",") if v),
                        predict=ns.predict, link_gbps=ns.link_gbps, link_latency_us=ns.link_latency_us,
                        storage_gbps=ns.storage_gbps, price_per_hour=ns.price_per_hour,
                        deadline_hours=ns.deadline_hours, epochs=ns.epochs, min_efficiency=ns.min_efficiency,
                        input_batches=ns.input_batches, timeout_s=ns.timeout_s)
    parse_config([*trainer_args, "--out", cfg.out])  # the trainer's own check of its flags, before any run
    return cfg, trainer_args


def _torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "--max-restarts=0", "--monitor-interval=0.5"]


def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def _run(cmd: list[str], *, log: Path, threads: int, timeout_s: float) -> None:
    """Run one job to the end (its output into `log`); on timeout kill its whole process group."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env(threads), start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # torchrun, its ranks and their loader workers
            except ProcessLookupError:
                pass
            proc.wait()
    if code != 0:
        tail = log.read_text()[-2000:]
        why = f"timed out after {timeout_s:.0f} s" if code is None else f"exit {code}"
        raise RuntimeError(f"{' '.join(cmd[:8])} ... {why}; its output is in {log}:\n{tail}")


def run_training(cfg: ScalingConfig, trainer_args: list[str], *, nproc: int, variant: str | None) -> dict[str, Any]:
    """One trainer job at `nproc` ranks; its summary.json (with where it ran)."""
    name = f"n{nproc}" + (f"-{cfg.sweep_flag}-{variant}" if variant is not None else "")
    out = Path(cfg.out) / "runs" / name
    extra = [f"--{cfg.sweep_flag}", variant] if variant is not None else []
    cmd = [*_torchrun(nproc), "-m", "trainer", *trainer_args, *extra, "--max-steps", str(cfg.steps),
           "--log-every", str(max(1, cfg.steps // 3)), "--out", str(out), "--resume", "none",
           "--num-threads", str(cfg.threads), "--no-live", "--checkpoint-dir", str(out / "checkpoints")]
    started = time.perf_counter()
    _run(cmd, log=out / "log.txt", threads=cfg.threads, timeout_s=cfg.timeout_s)
    summary = json.loads((out / "summary.json").read_text())
    summary["run"] = {"dir": str(out), "nproc": nproc, "variant": variant, "wall_s": time.perf_counter() - started}
    return summary


def run_comm_sweep(cfg: ScalingConfig, trainer_args: list[str]) -> dict[str, Any]:
    """All-reduce timings over message sizes at 2 ranks (gloo on CPU, NCCL on GPUs)."""
    out = Path(cfg.out) / "runs" / "comm-sweep"
    device = "cuda" if parse_config([*trainer_args, "--out", cfg.out]).device == "cuda" else "cpu"
    cmd = [*_torchrun(2), "-m", "trainer.scaling.comm_sweep", "--out", str(out / "sweep.json"),
           "--threads", str(cfg.threads), "--device", device]
    _run(cmd, log=out / "log.txt", threads=cfg.threads, timeout_s=cfg.timeout_s)
    return json.loads((out / "sweep.json").read_text())


def input_ceiling(cfg: ScalingConfig, trainer_args: list[str]) -> dict[str, Any]:
    """One rank's input pipeline alone (no model): samples/s over --input-batches after 3 warm-up batches."""
    import torch

    from trainer import data

    tcfg = parse_config([*trainer_args, "--out", cfg.out])
    torch.set_num_threads(cfg.threads)
    loader = data.open_loader(tcfg, tcfg.data, rank=0, world_size=1, train=True)
    try:
        loader.set_epoch(0)
        samples, start, it = 0, 0.0, iter(loader)
        count = min(len(loader), cfg.input_batches + 3)
        for i in range(count):
            batch = next(it)
            if i == 2:
                start = time.perf_counter()
            elif i > 2:
                samples += int(batch["mask"].sum())
        seconds = time.perf_counter() - start if count > 3 else 0.0
        close = getattr(it, "close", None)
        if close is not None:
            close()
    finally:
        data.close(loader)
    return {"samples_per_s": samples / seconds if seconds > 0 else None, "batches": max(0, count - 3),
            "num_workers": tcfg.num_workers}


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from trainer.scaling import chart, report

    console = Console(width=160, soft_wrap=True) if not sys.stdout.isatty() else Console()
    try:
        cfg, trainer_args = parse(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        console.print(f"trainer.scaling: error: {exc}")
        return 2
    variants: list[str | None] = list(cfg.sweep_values) or [None]
    runs = []
    try:
        for variant in variants:
            for n in cfg.nproc:
                label = f"{n} rank(s)" + (f", --{cfg.sweep_flag} {variant}" if variant is not None else "")
                console.print(f"[bold]running[/] {label}: {cfg.steps} steps, {cfg.threads} thread(s) per rank")
                runs.append(run_training(cfg, trainer_args, nproc=n, variant=variant))
        sweep = None
        if cfg.link_gbps is None and (max(cfg.nproc) > 1 or cfg.predict):
            console.print("[bold]running[/] all-reduce sweep at 2 ranks")
            sweep = run_comm_sweep(cfg, trainer_args)
        console.print("[bold]timing[/] one rank's input pipeline alone")
        ceiling = input_ceiling(cfg, trainer_args)
        result = report.build(cfg, runs, sweep=sweep, ceiling=ceiling, cpu_count=os.cpu_count() or 1)
    except (RuntimeError, OSError, ValueError) as exc:  # a failed run, or a sweep that fits no link
        console.print(f"trainer.scaling: error: {exc}")
        return 1
    report.write_json(cfg.out, result)
    chart.write_chart(os.path.join(cfg.out, "scaling.png"), result)
    report.show(console, result)
    return 0

