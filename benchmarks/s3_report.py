"""benchmarks/results_s3.md from a bench_s3 run: the rows in every form, the ratios and the S3 targets
(issue 11; issue 25: the per-sample form, the first batch, 0 and 2 workers)."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from tools.machine import machine_markdown

QUIET_LOAD = 1.0  # a 1-minute load average below this before the run: a quiet machine

HEADER = ["| shards | what | epoch 1 samples/s | later epochs samples/s | views samples/s | to_list samples/s | MB/s "
          "| first batch (s) | peak PSS (MiB) | load | runs (samples/s) |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]


def _median(rs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rs)


def _each(rs: list[dict[str, Any]], key: str, fmt: str) -> str:
    return ", ".join(format(r[key], fmt) for r in rs)


def _loader_row(size: str, kind: str, workers: int, rs: list[dict[str, Any]]) -> str:
    forms = [f"{_median(rs, f'samples_per_s {form}'):.0f}" if f"samples_per_s {form}" in rs[0] else "-"
             for form in ("views", "to_list")]
    return (f"| {size} | {kind} RAW, {workers} workers | {_median(rs, 'first_epoch_samples_per_s'):.0f} | "
            f"{_median(rs, 'samples_per_s'):.0f} | {forms[0]} | {forms[1]} | {_median(rs, 'mb_per_s'):.0f} | "
            f"{_median(rs, 'ttfb_s'):.2f} | {_median(rs, 'peak_pss_mib'):.0f} | {_median(rs, 'load'):.1f} | "
            f"{_runs(rs)} |")


def _runs(rs: list[dict[str, Any]]) -> str:
    """Each run's later-epochs rate; for shardify, each run's to_list rate too (the form the targets judge)."""
    packed = _each(rs, "samples_per_s", ".0f")
    return packed if "samples_per_s to_list" not in rs[0] else \
        f"{packed}; to_list {_each(rs, 'samples_per_s to_list', '.0f')}"


def _table(runs: dict[str, list[dict[str, Any]]], info: dict[str, Any], workers: int) -> list[str]:
    """One worker count's table: per shard size the server's ceiling, then shardify and webdataset."""
    out = list(HEADER)
    for size, d in info.items():
        c = runs[f"ceiling/{size}"]
        out.append(f"| {size} ({d['num_shards']} shards) | server ceiling (whole-object GETs, threads) | - | "
                   f"{_median(c, 'samples_per_s'):.0f} | - | - | {_median(c, 'bytes_per_s') / 1e6:.0f} | - | - | "
                   f"{_median(c, 'load'):.1f} | {_each(c, 'samples_per_s', '.0f')} |")
        for kind in ("shardify", "webdataset"):
            out.append(_loader_row(size, kind, workers, runs[f"{kind}/{size}/{workers}"]))
    return out


def _throughput(runs: dict[str, list[dict[str, Any]]], size: str, workers: int) -> tuple[str, bool]:
    """The per-sample (to_list) rate against 2x webdataset, or 80% of the ceiling where 2x is above it."""
    ours_rs, wds = runs[f"shardify/{size}/{workers}"], _median(runs[f"webdataset/{size}/{workers}"], "samples_per_s")
    ceil = _median(runs[f"ceiling/{size}"], "samples_per_s")
    rate = {form: _median(ours_rs, "samples_per_s" + ("" if form == "packed" else f" {form}"))
            for form in ("to_list", "views", "packed")}
    beside = f"views {rate['views']:.0f} ({rate['views'] / wds:.2f}x), packed {rate['packed']:.0f} " \
             f"({rate['packed'] / wds:.2f}x)"
    if 2 * wds <= ceil:
        return (f"to_list {rate['to_list']:.0f} vs webdataset {wds:.0f}: {rate['to_list'] / wds:.2f}x (2x = "
                f"{2 * wds:.0f} is below the ceiling {ceil:.0f}); {beside}", rate["to_list"] >= 2 * wds)
    return (f"to_list {rate['to_list']:.0f} = {rate['to_list'] / ceil:.0%} of the ceiling {ceil:.0f} (2x webdataset "
            f"= {2 * wds:.0f} is above it; vs webdataset {rate['to_list'] / wds:.2f}x); {beside}",
            rate["to_list"] >= 0.8 * ceil)


def _targets(runs: dict[str, list[dict[str, Any]]], counts: dict[str, Any], info: dict[str, Any],
             workers: tuple[int, ...]) -> list[str]:
    out = ["| target | measured | met |", "|---|---|---|"]
    for w in workers:
        for size in info:
            what, met = _throughput(runs, size, w)
            out.append(f"| RAW, {w} workers, {size} shards, per sample (to_list): >= 2x webdataset, or >= 80% of "
                       f"the ceiling where 2x is above it | {what} | {'yes' if met else 'NO'} |")
    for w in workers:
        for size in info:
            ours = _median(runs[f"shardify/{size}/{w}"], "ttfb_s")
            wds = _median(runs[f"webdataset/{size}/{w}"], "ttfb_s")
            out.append(f"| first batch, {w} workers, {size} shards: <= webdataset's | {ours:.2f} s vs {wds:.2f} s "
                       f"({wds / ours:.2f}x) | {'yes' if ours <= wds else 'NO'} |")
    for key, c in counts.items():
        size, w = key.split("/")
        kinds = ", ".join(f"{k} {v}" for k, v in c["kinds"].items())
        out.append(f"| start-up requests before the first batch, {size} shards ({info[size]['num_shards']} shards), "
                   f"{w} workers: bounded, no listing | {c['before_first_batch']} ({kinds}); {c['epoch']} in the "
                   f"epoch | {'yes' if c['kinds']['listing'] == 0 else 'NO'} |")
    return out


def _load_note(load_start: tuple[float, float, float]) -> str:
    figures = ", ".join(f"{x:.1f}" for x in load_start)
    quiet = (f"a quiet machine (1-minute load < {QUIET_LOAD} before the run)" if load_start[0] < QUIET_LOAD else
             f"**not a quiet machine** (1-minute load {load_start[0]:.1f} >= {QUIET_LOAD} before the run: other "
             "work shared the CPUs, single rates move with it; read the ratios)")
    return (f"Load average at the start: {figures} on {os.cpu_count()} cores: {quiet}; the server, the client and "
            "the loaders share those cores.")


def write_results(path: Path, runs: dict[str, list[dict[str, Any]]], counts: dict[str, Any], info: dict[str, Any],
                  args: argparse.Namespace, load_start: tuple[float, float, float], torch: str) -> None:
    """Write the run's tables, targets and set-up to `path` (and print the targets)."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    first = next(iter(info.values()))
    workers = tuple(sorted(args.workers, reverse=True))  # the 2-worker table first (the headline reads it)
    tables = [line for w in workers for line in ("", f"### {w} workers", "", *_table(runs, info, w))]
    targets = _targets(runs, counts, info, workers)
    lines = [
        "# Object storage: shardify RAW vs WebDataset vs the server's ceiling (issues 11 and 25)", "",
        f"Run {when}: `python -m benchmarks.bench_s3 --num-images {args.num_images} --repeats {args.repeats} "
        f"--epochs {args.epochs} --workers {','.join(map(str, args.workers))}`; local SeaweedFS (tools/s3_server.py) "
        f"on this machine, {first['num_samples']} ImageNet-like JPEGs ({first['bytes_per_sample'] / 1e3:.0f} KB mean "
        "sample) as tar shards of 64 MB and 256 MB (the same images, `shardify write --shuffle`), uploaded byte for "
        f"byte; batch {args.batch_size}, persistent workers, torch {torch}; medians of {args.repeats} interleaved "
        "rounds, each loader run in a fresh process.", "",
        machine_markdown() + " " + _load_note(load_start), "",
        "Forms: shardify's \"later epochs\" is its packed form (PackedBytes as delivered); \"views\" walks every "
        "sample's zero-copy memoryview (`for v in batch['jpg']`), \"to_list\" copies each into `bytes` "
        "(`batch['jpg'].to_list()`), the form code that needs `bytes` consumes. webdataset's batches are lists of "
        "per-sample `bytes` already: its one rate is its per-sample form. The targets compare to_list with it, "
        "views and packed beside.", *tables, "",
        "## Targets (issue 11; issue 25, items 2 and 4)", "", *targets, "",
        "## How it is measured", "",
        f"- Ceiling: {args.ceiling_threads} threads of boto3 whole-object GETs over every shard, {args.epochs} "
        "passes, bodies streamed in 1 MiB chunks and dropped; samples/s = bytes/s over the mean sample's bytes "
        "(the same measurement in each table).",
        "- shardify: `make_loader(s3://..., batch_size, num_workers, decode=None, tail='pad')` with its "
        "defaults (benchmarks/loader_peers.py); webdataset: `WebDataset(urls, shardshuffle=100).shuffle(1000)` "
        "+ `WebLoader`, its URLs opened through fsspec/s3fs (8 MiB blocks). \"epoch 1\": the first pass, packed; "
        "shardify's later passes cycle through the forms (one epoch each, benchmarks/loader_child.py), "
        "webdataset's are its later passes; first batch: from building the loader (library imported) to the first "
        "batch.",
        "- Start-up requests: one untimed shardify run per worker count through tools/delay_proxy.py (no delay), "
        "counting request lines until the first batch arrives.", "",
    ]
    path.write_text("\n".join(lines))
    print("\n".join(targets))
