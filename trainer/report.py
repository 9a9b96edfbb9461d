"""The overlap report: per-rank step records summed per interval, gathered, judged, printed.

`summarize(records)` runs on every rank; `combine(per_rank)` on the gathered list says the
global and per-rank samples/s, the data-wait share, how much loading work was hidden behind
compute, the slowest rank (by its own time: step minus time spent waiting for peers in
all-reduce) against the median, the slowest stage, and a verdict with what to try first.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from trainer.timing import PHASES, StepRecord

INPUT_BOUND_SHARE = 0.10  # more than this share of step time blocked on data: input-bound
STRAGGLER_RATIO = 1.15  # a rank's own time this much above the median: named as a straggler
STAGE_LABELS = {"wait": "data wait", "h2d": "host->device", "compute": "forward+backward",
                "comm_exposed": "comm (exposed)", "opt": "optimizer"}


def summarize(records: Sequence[StepRecord], *, rank: int) -> dict[str, Any]:
    """Sums of one rank's records over an interval (plain data, cheap to gather)."""
    out: dict[str, Any] = {"rank": rank, "steps": len(records)}
    for key in ("step_s", "wait_s", "h2d_s", "compute_s", "comm_exposed_s", "comm_overlapped_s",
                "opt_s", "read_s", "decode_s"):
        out[key] = float(sum(getattr(r, key) for r in records))
    out["samples"] = int(sum(r.samples for r in records))
    out["hidden_load_s"] = float(sum(max(0.0, r.load_work_s - r.wait_s) for r in records))
    return out


def combine(per_rank: Sequence[dict[str, Any]], *, num_workers: int = 0, decode: str = "cpu",
            tokens_per_sample: int | None = None, gpu_decode: dict[str, Any] | None = None) -> dict[str, Any]:
    """The gathered report of one interval: global numbers, per-rank rows, straggler, verdict. A token
    run (tokens_per_sample: its seq_len; a sample is a sequence) also says tokens and tokens/s;
    `gpu_decode`: the loader's GPU decode facts (decode gpu/auto: codec, split, each side's rate)."""
    rows = [dict(r) for r in sorted(per_rank, key=lambda r: r["rank"])]
    for r in rows:
        step_s = r["step_s"] or 1e-12
        r["samples_per_s"] = r["samples"] / step_s
        r["wait_share"] = r["wait_s"] / step_s
        r["own_s"] = max(0.0, r["step_s"] - r["comm_exposed_s"])  # not counting waits for peers
        load = r["read_s"] + r["decode_s"]
        r["hidden_load_share"] = r["hidden_load_s"] / load if load > 0 else 1.0
    wall_s = max(r["step_s"] for r in rows) or 1e-12
    total_step = sum(r["step_s"] for r in rows) or 1e-12
    stage_s = {p: sum(r[f"{p}_s"] for r in rows) for p in PHASES}
    own = [r["own_s"] for r in rows]
    median_own = statistics.median(own)
    slow = max(rows, key=lambda r: r["own_s"])
    load_work = sum(r["read_s"] + r["decode_s"] for r in rows)
    out = {
        "steps": rows[0]["steps"],
        "world_size": len(rows),
        "samples": sum(r["samples"] for r in rows),
        "samples_per_s": sum(r["samples"] for r in rows) / wall_s,
        "wait_share": sum(r["wait_s"] for r in rows) / total_step,
        "stage_share": {p: s / total_step for p, s in stage_s.items()},
        "comm_overlapped_share": sum(r["comm_overlapped_s"] for r in rows) / total_step,
        "slowest_stage": max(stage_s, key=stage_s.__getitem__),
        "slowest_rank": slow["rank"],
        "slowest_rank_vs_median": slow["own_s"] / median_own if median_own > 0 else 1.0,
        "load_work_s": load_work,
        "hidden_load_share": sum(r["hidden_load_s"] for r in rows) / load_work if load_work > 0 else 1.0,
        "read_share_of_load": sum(r["read_s"] for r in rows) / load_work if load_work > 0 else 0.0,
        "ranks": rows,
    }
    if tokens_per_sample:
        out["tokens_per_sample"] = tokens_per_sample
        for r in (out, *rows):
            r["tokens"], r["tokens_per_s"] = r["samples"] * tokens_per_sample, r["samples_per_s"] * tokens_per_sample
    out["straggler"] = slow["rank"] if len(rows) > 1 and out["slowest_rank_vs_median"] >= STRAGGLER_RATIO else None
    if gpu_decode:
        out["gpu_decode"] = dict(gpu_decode)
    out["verdict"] = verdict(out, num_workers=num_workers, decode=decode, gpu_decode=gpu_decode)
    return out


def verdict(rep: dict[str, Any], *, num_workers: int, decode: str, has_gpu: bool | None = None,
            dali_cpu_speedup: float | None = None, gpu_decode: dict[str, Any] | None = None,
            offered: Sequence[str] | None = None) -> str:
    """One line: input- or compute-bound, from the measured shares, and what to try first.

    With a GPU (`has_gpu`; None: ask torch), GPU decode is advised: --decode auto or gpu where the
    loader offers them (`offered`; None: the loader's own list), else dali; without one, dali only
    where its CPU decode was measured faster than --decode cpu here (`dali_cpu_speedup` > 1). Under
    --decode gpu/auto the tip quotes the loader's measured split and rates (`gpu_decode`)."""
    wait, share = rep["wait_share"], rep["stage_share"]
    parts = []
    if wait > INPUT_BOUND_SHARE:
        if rep["read_share_of_load"] >= 0.5:
            tip = ("reads dominate loading: raise prefetch / read-ahead and --num-workers"
                   f" (now {num_workers}), or move the data closer")
        elif decode == "cpu":
            tip = _decode_tip(rep, num_workers=num_workers, has_gpu=has_gpu, dali_cpu_speedup=dali_cpu_speedup,
                              offered=offered)
        elif decode in ("gpu", "auto"):
            tip = _gpu_decode_tip(decode, gpu_decode or {}, num_workers=num_workers)
        else:
            tip = (f"decode is DALI already (it runs inside next(), so it is never hidden): try more "
                   f"--num-workers (now {num_workers}) for reads, or more prefetch")
        parts.append(f"INPUT-BOUND: {wait:.0%} of step time waits for data, "
                     f"{rep['hidden_load_share']:.0%} of loading work hidden; {tip}")
    else:
        compute = share["compute"] + share["opt"]
        comm = share["comm_exposed"]
        if comm > 0.25 and rep.get("straggler") is not None:
            tip = f"exposed comm is mostly waiting for rank {rep['straggler']}: fix that rank first"
        elif comm > 0.25:
            tip = "exposed all-reduce is large: try --grad-accum or a bigger --batch-size"
        else:
            tip = ("the input pipeline keeps up; try a bigger --batch-size (or a faster model: --precision bf16, "
                   "--channels-last, --compile) first")
        parts.append(f"COMPUTE-BOUND: data wait {wait:.0%}, compute {compute:.0%}, "
                     f"exposed comm {comm:.0%} of step time; {tip}")
    if rep.get("straggler") is not None:
        parts.append(f"straggler: rank {rep['straggler']} is {rep['slowest_rank_vs_median']:.2f}x "
                     "the median rank's own time (others wait for it in all-reduce)")
    return " | ".join(parts)


def _decode_tip(rep: dict[str, Any], *, num_workers: int, has_gpu: bool | None,
                dali_cpu_speedup: float | None, offered: Sequence[str] | None = None) -> str:
    """What to try when CPU decode dominates loading, naming what was measured."""
    measured = f"decode is {1 - rep['read_share_of_load']:.0%} of the measured loading work"
    if has_gpu is None:
        import torch

        has_gpu = torch.cuda.is_available()
    if offered is None:
        from dataio.loader.config import DECODES

        offered = DECODES
    gpu = [d for d in ("auto", "gpu") if d in offered]
    if has_gpu and gpu:
        return (f"{measured}: try --decode {gpu[0]} (the GPU decodes "
                + ("beside the CPU workers, split by their measured rates" if gpu[0] == "auto" else "every batch")
                + f"), or more --num-workers (now {num_workers})")
    if has_gpu:
        install = "" if _dali_installed() else " after `pip install 'shardify[dali]'` (DALI is not installed here)"
        return f"{measured}: try --decode dali (GPU decode){install}, or more --num-workers (now {num_workers})"
    if dali_cpu_speedup is not None and dali_cpu_speedup > 1:
        return (f"{measured}: try --decode dali (its CPU decode measured {dali_cpu_speedup:.2f}x --decode cpu on "
                f"this machine), or more --num-workers (now {num_workers})")
    why = ("DALI's CPU decode was not measured faster than --decode cpu here" if dali_cpu_speedup is None else
           f"DALI's CPU decode measured {dali_cpu_speedup:.2f}x --decode cpu here")
    return (f"{measured}: more --num-workers (now {num_workers}) or more CPU cores; --decode dali is not advised "
            f"without a GPU ({why})")


def _gpu_decode_tip(decode: str, facts: dict[str, Any], *, num_workers: int) -> str:
    """What to try when decode="gpu"/"auto" still leaves the trainer waiting, from the loader's measured facts."""
    codec = facts.get("codec", "the GPU decoder")
    if "CPU" in codec or str(facts.get("device", "cuda")).startswith("cpu"):
        return (f"--decode {decode} decoded with {codec}, not on a GPU: on a CUDA machine install the GPU decoders "
                "(`pip install -e \".[gpu]\"`), or use --decode cpu with more --num-workers "
                f"(now {num_workers})")
    gpu_rate, cpu_rate = facts.get("gpu_samples_per_s"), facts.get("cpu_samples_per_s")
    if decode == "gpu":
        fallback = facts.get("cpu_path_samples", 0)
        return (f"every batch is decoded on the GPU ({codec}; {fallback} samples on its CPU path): try --decode auto, "
                f"so the {num_workers} CPU workers decode a share beside it, or more --num-workers for reads")
    if gpu_rate and cpu_rate:
        faster = "GPU" if gpu_rate >= cpu_rate else f"{num_workers} CPU workers'"
        return (f"--decode auto gives the GPU ({codec}) {facts.get('gpu_share', 0):.0%} of batches; measured "
                f"{gpu_rate:,.0f} samples/s on the GPU and {cpu_rate:,.0f} on the {num_workers} CPU workers (the "
                f"{faster} side is faster) and still short: more --num-workers or cores for the CPU side, or "
                "a GPU with hardware JPEG engines")
    return (f"--decode auto has not measured both sides yet ({codec}): more --num-workers (now {num_workers}), or "
            "a longer run before judging")


def _dali_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except ModuleNotFoundError:  # no `nvidia` namespace package at all
        return False


def source_rows(per_rank: Sequence[dict[str, Any]], *, names: Sequence[str], requested: Sequence[float],
                samples_per_s: float) -> list[dict[str, Any]]:
    """A mixture's sources over an interval: real samples, samples/s (its observed share of the
    global `samples_per_s`), and the observed share next to the requested one, so a drifting
    mixture shows. Rows carry `source_samples` (real samples per source on that rank)."""
    counts = [sum(r["source_samples"][i] for r in per_rank) for i in range(len(names))]
    total = sum(counts) or 1
    return [{"source": name, "samples": c, "samples_per_s": c / total * samples_per_s, "observed": c / total,
             "requested": req} for name, c, req in zip(names, counts, requested, strict=True)]


def metrics_line(rep: dict[str, Any], *, step: int, epoch: int, loss: float, lr: float) -> dict[str, Any]:
    """One metrics.jsonl record for a log interval (with `sources` when training on a mixture)."""
    keys = ("steps", "world_size", "samples_per_s", "wait_share", "stage_share", "comm_overlapped_share",
            "slowest_stage", "slowest_rank", "slowest_rank_vs_median", "straggler", "hidden_load_share",
            "load_work_s", "verdict", "ranks")
    extra = {"sources": rep["sources"]} if rep.get("sources") else {}
    if "tokens_per_s" in rep:
        extra.update(tokens_per_s=rep["tokens_per_s"], tokens=rep["tokens"])
    return {"kind": "train", "step": step, "epoch": epoch, "loss": loss, "lr": lr, **{k: rep[k] for k in keys},
            **extra}
