"""The scaling report: measured rows per world size, the prediction past the machine, the bill.

`build` is plain arithmetic over the runs' summaries (tested without processes); `write_json` saves
scaling.json (trainer/scaling/chart.py draws scaling.png); `show` prints the rich tables and the verdict lines.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from trainer.scaling import cost, predict
from trainer.timing import PHASES

SHARES = (*PHASES, "other")
SHARE_LABELS = {"wait": "data wait", "h2d": "h2d", "compute": "compute", "comm_exposed": "exposed comm",
                "opt": "optimizer", "other": "other"}


def measured_row(summary: dict[str, Any], *, base: dict[str, Any] | None, threads: int, cpu_count: int) -> dict[str, Any]:
    """One world size's row from its summary.json; efficiency against `base` (the smallest run)."""
    n = summary["world_size"]
    shares = {p: float(summary["stage_share"][p]) for p in PHASES}
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    ranks = summary["ranks"]
    steps = max(1, ranks[0]["steps"])
    rate = float(summary["samples_per_s"])
    row = {"world_size": n, "variant": summary["run"]["variant"], "samples_per_s": rate,
           "per_rank_samples_per_s": rate / n, "efficiency": 1.0, "stage_share": shares,
           "comm_overlapped_share": float(summary["comm_overlapped_share"]),
           "step_ms": 1000 * max(r["step_s"] for r in ranks) / steps,
           "stage_ms": {p: 1000 * sum(r[f"{p}_s"] for r in ranks) / len(ranks) / steps for p in PHASES},
           "comm_ms": 1000 * max(r["comm_exposed_s"] + r["comm_overlapped_s"] for r in ranks) / steps,
           "slowest_rank": summary["slowest_rank"], "slowest_rank_vs_median": summary["slowest_rank_vs_median"],
           "straggler": summary["straggler"], "steps": steps, "oversubscribed": n * threads > cpu_count,
           "dir": summary["run"]["dir"]}
    if base is not None:
        row["efficiency"] = rate / (n / base["world_size"] * base["samples_per_s"])
    return row


def step_of(summary: dict[str, Any]) -> float:
    """A rank's step (s) as the measured rate says it: the samples of one rank's step / that rank's share of
    the rate. The model is calibrated on this, so that its rate is the measured one where calibrated."""
    return summary["job"]["global_batch"] / float(summary["samples_per_s"])


def _per_step(summary: dict[str, Any], key: str) -> float:
    """Seconds of `key` per step, the mean over ranks."""
    ranks = summary["ranks"]
    return sum(r[key] for r in ranks) / sum(r["steps"] for r in ranks)


def calibration_runs(runs: Sequence[dict[str, Any]], max_cores: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the smallest N's run, the largest N's run whose ranks x threads fit the cores): the model's fit points."""
    small = min(runs, key=lambda s: s["world_size"])
    fair = [s for s in runs if max_cores is None or s["world_size"] <= max_cores] or [small]
    return small, max(fair, key=lambda s: s["world_size"])


def model_check(rows: Sequence[dict[str, Any]], predicted: Sequence[dict[str, Any]],
                calibrated: set[int]) -> list[dict[str, Any]]:
    """The prediction against the measurement at every measured N: its relative error, and whether the model
    was calibrated there (where it is exact by construction) or not (an oversubscribed N, an N between)."""
    by_n = {p["world_size"]: p for p in predicted}
    out = []
    for r in rows:
        n, seen = r["world_size"], r["samples_per_s"]
        said = by_n[n]["samples_per_s"]
        out.append({"world_size": n, "measured_samples_per_s": seen, "predicted_samples_per_s": said,
                    "error": said / seen - 1.0 if seen > 0 else math.inf, "calibrated": n in calibrated,
                    "oversubscribed": r["oversubscribed"]})
    return out


def measurements(runs: Sequence[dict[str, Any]], *, ceiling: dict[str, Any] | None,
                 storage_gbps: float | None, link: predict.Link, max_cores: int | None = None) -> predict.Measured:
    """The prediction's inputs from the runs of one variant: a rank's own step at the smallest N; overlap,
    comm beyond the link model and the step beyond the whole model at the largest N using at most
    `max_cores` threads (not oversubscribed). The model then gives the measured rate at N=1 (when
    measured) and at that largest N; `model_check` says how far it is at every other measured N."""
    small, large = calibration_runs(runs, max_cores)
    wait = _per_step(small, "wait_s")
    exposed_small = _per_step(small, "comm_exposed_s") if small["world_size"] > 1 else 0.0  # N=1: bookkeeping
    local = max(step_of(small) - wait - exposed_small, 1e-9)
    exposed = sum(r["comm_exposed_s"] for r in large["ranks"])
    overlapped = sum(r["comm_overlapped_s"] for r in large["ranks"])
    job = small["job"]
    wire = job.get("wire_bytes") or job["grad_bytes"]
    buckets = max(1, int(large["job"].get("buckets_per_step") or 1))
    m = predict.Measured(
        samples_per_step=job["global_batch"] / small["world_size"], local_s=local, wait_s=wait,
        wire_bytes=wire, num_buckets=buckets,
        overlap_share=overlapped / (exposed + overlapped) if exposed + overlapped > 0 else 0.0,
        input_per_rank=(ceiling or {}).get("samples_per_s"), bytes_per_sample=float(job.get("bytes_per_sample", 0.0)),
        storage_bytes_per_s=None if storage_gbps is None else storage_gbps * 1e9 / 8)
    if large["world_size"] == 1:
        return m
    # What the link model does not explain of the comm at the largest measured N, kept at every N > 1;
    measured = (exposed + overlapped) / sum(r["steps"] for r in large["ranks"])
    extra = max(0.0, measured - predict.allreduce_s(link, wire, large["world_size"], num_messages=buckets))
    m = dataclasses.replace(m, comm_extra_s=extra)
    # then what the measured step there has beyond the whole model (shared cores, the slowest rank), also
    # kept: the model goes through that point. Only a given link much slower than the measured runs' could
    # ask for less than -(local + wait); it is bounded at half of that, and the check shows the difference.
    beyond = step_of(large) - predict.step_s(m, link, large["world_size"])
    return dataclasses.replace(m, step_extra_s=max(beyond, -0.5 * (local + wait)))


def link_of(cfg: Any, sweep: dict[str, Any] | None) -> tuple[predict.Link, dict[str, Any]]:
    """The link: --link-gbps/--link-latency-us when given, else fitted from the sweep (either part)."""
    fitted = None
    if sweep is not None:
        fitted = predict.fit_link(sweep["sizes_bytes"], sweep["seconds"], world_size=sweep["world_size"])
    if cfg.link_gbps is not None:
        latency = cfg.link_latency_us * 1e-6 if cfg.link_latency_us is not None else (fitted.latency_s if fitted else 0.0)
        link, source = predict.Link(latency_s=latency, bytes_per_s=cfg.link_gbps * 1e9 / 8), "given"
    elif fitted is not None:
        latency = cfg.link_latency_us * 1e-6 if cfg.link_latency_us is not None else fitted.latency_s
        link, source = predict.Link(latency_s=latency, bytes_per_s=fitted.bytes_per_s), "fitted at 2 ranks"
    else:
        raise ValueError("no all-reduce sweep and no --link-gbps: nothing to predict comm from")
    return link, {"latency_us": link.latency_s * 1e6, "gbps": link.bytes_per_s * 8 / 1e9, "source": source,
                  "sweep": sweep}


def _priced(cfg: Any, rows: list[dict[str, Any]], epoch_samples: int, tokens_per_sample: int | None
            ) -> dict[str, Any] | None:
    """Attach a cost to each row (measured or predicted) and choose; None without --price-per-hour.
    A token run's rows (tokens_per_sample: its seq_len) also get tokens/s and $ per million tokens."""
    for row in rows:
        if tokens_per_sample:
            row["tokens_per_s"] = row["samples_per_s"] * tokens_per_sample
    if cfg.price_per_hour is None:
        return None
    options = []
    for row in rows:
        wasted = cost.wasted_share(row["stage_share"]) if "stage_share" in row else row["wasted_share"]
        row["cost"] = cost.cost_of(price_per_hour=cfg.price_per_hour, world_size=row["world_size"],
                                   samples_per_s=row["samples_per_s"], epoch_samples=epoch_samples,
                                   wasted_share=wasted, tokens_per_sample=tokens_per_sample)
        options.append(row["cost"])
    return cost.choose(options, epochs=cfg.epochs, deadline_hours=cfg.deadline_hours)


def _variant(cfg: Any, summaries: list[dict[str, Any]], *, link: predict.Link, ceiling: dict[str, Any] | None,
             threads: int, cpu_count: int) -> dict[str, Any]:
    summaries = sorted(summaries, key=lambda s: s["world_size"])
    base = summaries[0] if summaries else None
    rows = [measured_row(s, base=base, threads=threads, cpu_count=cpu_count) for s in summaries]
    m = measurements(summaries, ceiling=ceiling, storage_gbps=cfg.storage_gbps, link=link,
                     max_cores=cpu_count // threads)
    measured_ns = {r["world_size"] for r in rows}
    sizes = sorted(measured_ns | set(cfg.predict))
    predicted = predict.predict(m, link, sizes)
    two = next((r for r in rows if r["world_size"] == 2), None)
    check = None if two is None else {"measured_comm_ms": two["comm_ms"],
                                      "link_model_comm_ms": 1000 * predict.allreduce_s(link, m.wire_bytes, 2,
                                                                                       num_messages=m.num_buckets),
                                      "kept_extra_ms": 1000 * m.comm_extra_s}
    small, large = calibration_runs(summaries, cpu_count // threads)
    n_large = large["world_size"]
    calibration = None if n_large == 1 else {
        "world_size": n_large, "measured_step_ms": 1000 * step_of(large),
        "model_step_ms": 1000 * (predict.step_s(m, link, n_large) - m.step_extra_s),
        "kept_step_extra_ms": 1000 * m.step_extra_s}
    calibrated = {n_large} | ({1} if small["world_size"] == 1 else set())
    epoch_samples = int(summaries[0]["job"].get("dataset_samples") or summaries[0]["job"]["epoch_samples"])
    tokens = summaries[0]["job"].get("tokens_per_sample")  # a token run (--model gpt): its seq_len
    choice = _priced(cfg, rows + [p for p in predicted if p["world_size"] not in measured_ns], epoch_samples, tokens)
    _priced(cfg, [p for p in predicted if p["world_size"] in measured_ns], epoch_samples, tokens)  # shown only
    curve = predict.predict(m, link, sorted(measured_ns | set(log2_ticks(sizes)) | set(sizes)))  # for the chart
    return {"variant": summaries[0]["run"]["variant"], "measured": rows, "predicted": predicted, "curve": curve,
            "inputs": {k: getattr(m, k) for k in m.__slots__}, "model_check_at_2": check, "calibration": calibration,
            "model_check": model_check(rows, predicted, calibrated),
            "walls": predict.walls(m, link, max_world_size=max(sizes), min_efficiency=cfg.min_efficiency),
            "choice": choice, "epoch_samples": epoch_samples, "tokens_per_sample": tokens}


def build(cfg: Any, runs: Sequence[dict[str, Any]], *, sweep: dict[str, Any] | None,
          ceiling: dict[str, Any] | None, cpu_count: int) -> dict[str, Any]:
    """scaling.json's content: per variant (one when nothing is swept) the measured and predicted rows."""
    link, link_info = link_of(cfg, sweep)
    by_variant: dict[Any, list[dict[str, Any]]] = {}
    for s in runs:
        by_variant.setdefault(s["run"]["variant"], []).append(s)
    variants = [_variant(cfg, group, link=link, ceiling=ceiling, threads=cfg.threads, cpu_count=cpu_count)
                for group in by_variant.values()]
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"config": {k: getattr(cfg, k) for k in cfg.__slots__}, "cpu_count": cpu_count, "load_avg": load,
            "link": link_info, "input_ceiling": ceiling, "variants": variants}


def write_json(out: str, result: dict[str, Any]) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "scaling.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)


def _money(x: float | None) -> str:
    if x is None:
        return "-"
    return f"${x:,.2f}" if x >= 1 else f"${x:.2g}"


def _rate(v: dict[str, Any], samples_per_s: float) -> str:
    """A rate cell of variant v: tokens/s for a token run (samples are sequences), else samples/s."""
    tokens = v.get("tokens_per_sample")
    return f"{samples_per_s * tokens:,.0f}" if tokens else f"{samples_per_s:.1f}"


def _ranks(n: int) -> str:
    return f"{n} rank" + ("" if n == 1 else "s")


def measured_table(result: dict[str, Any]) -> Table:
    swept = result["config"]["sweep_flag"]
    table = Table(title="scaling: measured (real torchrun jobs, "
                        f"{result['config']['threads']} thread(s) per rank, {result['cpu_count']} cores)")
    table_shares = ("wait", "compute", "comm_exposed", "opt")
    tokens = any(v.get("tokens_per_sample") for v in result["variants"])  # a token run: tokens/s, $ per 1M tokens
    for name in ("ranks", *([swept] if swept else []), "tokens/s" if tokens else "samples/s", "effic.", "data wait",
                 "compute", "exp. comm", "optim.", "other**", "overlap*", "slowest", "$/epoch",
                 "$/1M tok" if tokens else "$/1k", "wasted"):
        table.add_column(name, justify="right", no_wrap=name == "ranks")
    for v in result["variants"]:
        for r in v["measured"]:
            c = r.get("cost") or {}
            share = r["stage_share"]
            n = f"{r['world_size']}" + (" (>cores)" if r["oversubscribed"] else "")
            table.add_row(n, *([str(v["variant"]).split(":")[-1]] if swept else []), _rate(v, r["samples_per_s"]),
                          f"{r['efficiency']:.0%}", *(f"{share[p]:.0%}" for p in table_shares),
                          f"{share['h2d'] + share['other']:.0%}", f"{r['comm_overlapped_share']:.0%}",
                          f"r{r['slowest_rank']} {r['slowest_rank_vs_median']:.2f}x",
                          _money(c.get("dollars_per_epoch")),
                          _money(c.get("dollars_per_1m_tokens" if tokens else "dollars_per_1k_samples")),
                          "-" if not c else f"{c['wasted_share']:.0%}")
    table.caption = ("shares of step time, all ranks; * overlapped comm ran inside compute (not added); ** host->device "
                     "copy and bookkeeping; wasted = data wait + exposed comm (paid, idle); "
                     + ("$/1M tok = per million tokens; " if tokens else "$/1k = per 1000 samples; ")
                     + "effic. = rate at N / (N x rate at the smallest N); (>cores): ranks x threads > cores")
    return table


def predicted_table(v: dict[str, Any], link: dict[str, Any]) -> Table:
    label = f" ({str(v['variant']).split(':')[-1]})" if v["variant"] is not None else ""
    table = Table(title=f"prediction{label}: ring all-reduce, link {link['gbps']:.2f} Gbit/s, "
                        f"{link['latency_us']:.0f} us/hop ({link['source']})")
    rate = "tokens/s" if v.get("tokens_per_sample") else "samples/s"
    for name in ("ranks", rate, "measured", "error", "efficiency", "all-reduce ms", "exposed ms", "limited by",
                 "$/epoch"):
        table.add_column(name, justify="right")
    checks = {c["world_size"]: c for c in v["model_check"]}
    for r in v["predicted"]:
        c = checks.get(r["world_size"])
        table.add_row(str(r["world_size"]), _rate(v, r["samples_per_s"]),
                      "" if c is None else _rate(v, c["measured_samples_per_s"]),
                      "" if c is None else f"{c['error']:+.1%}" + ("*" if c["calibrated"] else ""),
                      f"{r['efficiency']:.0%}",
                      f"{1000 * r['allreduce_s']:.2f}", f"{1000 * r['exposed_comm_s']:.2f}", r["limit"],
                      _money((r.get("cost") or {}).get("dollars_per_epoch")))
    table.caption = "error = predicted / measured - 1; * calibrated on that run (exact unless a data wall binds)"
    return table


def check_lines(v: dict[str, Any], label: str) -> list[str]:
    """What the model was calibrated on, and its error at every measured N."""
    out = []
    cal = v["calibration"]
    if cal:
        out.append(f"{label}step at {_ranks(cal['world_size'])}: {cal['measured_step_ms']:.2f} ms measured, "
                   f"{cal['model_step_ms']:.2f} ms from a rank's own work, its data wait and the exposed all-reduce; "
                   f"the prediction keeps the {cal['kept_step_extra_ms']:+.2f} ms difference (ranks sharing cores, "
                   "waiting for the slowest rank) at every N > 1")
    said = []
    for c in v["model_check"]:
        why = "calibrated" if c["calibrated"] else (">cores, not calibrated on" if c["oversubscribed"] else "checked")
        said.append(f"{_ranks(c['world_size'])} {_rate(v, c['predicted_samples_per_s'])} predicted / "
                    f"{_rate(v, c['measured_samples_per_s'])} measured ({c['error']:+.1%}, {why})")
    unit = "tokens/s" if v.get("tokens_per_sample") else "samples/s"
    out.append(f"{label}model check, {unit}: " + "; ".join(said))
    return out


def lines(v: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    """The verdict lines of one variant: walls, model check, the bill's choices."""
    label = f"[{str(v['variant']).split(':')[-1]}] " if v["variant"] is not None else ""
    out = [f"{label}walls: {v['walls']['text']}"]
    chk = v["model_check_at_2"]
    if chk:
        out.append(f"{label}all-reduce at 2 ranks: {chk['measured_comm_ms']:.2f} ms/step measured, the link model "
                   f"says {chk['link_model_comm_ms']:.2f} ms; the prediction keeps the {chk['kept_extra_ms']:.2f} ms "
                   "difference (hook work, waiting for peers) at every N")
    out.extend(check_lines(v, label))
    ceiling = v["inputs"]["input_per_rank"]
    if ceiling:
        unit = "tokens/s" if v.get("tokens_per_sample") else "samples/s"
        computes = v["inputs"]["samples_per_step"] / v["inputs"]["local_s"]
        out.append(f"{label}input pipeline alone: {_rate(v, ceiling)} {unit} per rank (a rank computes "
                   f"{_rate(v, computes)})")
    ch = v["choice"]
    if ch:
        text = f"{label}cheapest per epoch: {_ranks(ch['cheapest'])} ({_money(ch['cheapest_dollars_per_epoch'])})"
        if cfg["deadline_hours"] is not None:
            if ch["smallest_meeting_deadline"] is None:
                text += f"; no world size finishes {cfg['epochs']} epochs in {cfg['deadline_hours']} h"
            else:
                text += (f"; smallest meeting {cfg['deadline_hours']} h for {cfg['epochs']} epochs: "
                         f"{_ranks(ch['smallest_meeting_deadline'])} ({ch['hours_at_smallest']:.3g} h, "
                         f"{_money(ch['dollars_at_smallest'])})")
        out.append(text)
    return out


def show(console: Console, result: dict[str, Any]) -> None:
    console.print(measured_table(result))
    for v in result["variants"]:
        console.print(predicted_table(v, result["link"]))
        for line in lines(v, result["config"]):
            console.print(line)
    out = result["config"]["out"]
    console.print(f"outputs: {os.path.join(out, 'scaling.json')}, {os.path.join(out, 'scaling.png')}")


def log2_ticks(sizes: Sequence[int]) -> list[int]:
    """Powers of two spanning `sizes` (chart ticks)."""
    top = max(sizes)
    return [2**k for k in range(0, int(math.log2(top)) + 1)]
