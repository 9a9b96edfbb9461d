"""benchmarks/results_s3.md from a bench_s3 run: the rows, the ratios and issue 11's S3 targets."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from tools.machine import machine_markdown


def _median(rs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rs)


def _each(rs: list[dict[str, Any]], key: str, fmt: str) -> str:
    return ", ".join(format(r[key], fmt) for r in rs)


def _rows(runs: dict[str, list[dict[str, Any]]], info: dict[str, Any]) -> list[str]:
    out = ["| shards | what | epoch 1 samples/s | later epochs samples/s | MB/s | first batch (s) | peak PSS (MiB) "
           "| load | runs (samples/s) |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for size, d in info.items():
        c = runs[f"ceiling/{size}"]
        out.append(f"| {size} ({d['num_shards']} shards) | server ceiling (whole-object GETs, threads) | - | "
                   f"{_median(c, 'samples_per_s'):.0f} | {_median(c, 'bytes_per_s') / 1e6:.0f} | - | - | "
                   f"{_median(c, 'load'):.1f} | {_each(c, 'samples_per_s', '.0f')} |")
        for kind in ("shardify", "webdataset"):
            rs = runs[f"{kind}/{size}"]
            out.append(f"| {size} | {kind} RAW, 2 workers | {_median(rs, 'first_epoch_samples_per_s'):.0f} | "
                       f"{_median(rs, 'samples_per_s'):.0f} | {_median(rs, 'mb_per_s'):.0f} | "
                       f"{_median(rs, 'ttfb_s'):.2f} | {_median(rs, 'peak_pss_mib'):.0f} | {_median(rs, 'load'):.1f} | "
                       f"{_each(rs, 'samples_per_s', '.0f')} |")
    return out


def _targets(runs: dict[str, list[dict[str, Any]]], counts: dict[str, Any], info: dict[str, Any]) -> list[str]:
    out = ["| target | measured | met |", "|---|---|---|"]
    for size in info:
        ours, wds = _median(runs[f"shardify/{size}"], "samples_per_s"), _median(runs[f"webdataset/{size}"], "samples_per_s")
        ceil = _median(runs[f"ceiling/{size}"], "samples_per_s")
        if 2 * wds <= ceil:
            met = ours >= 2 * wds
            what = f"{ours:.0f} vs webdataset {wds:.0f}: {ours / wds:.2f}x (2x = {2 * wds:.0f} is below the ceiling {ceil:.0f})"
        else:
            met = ours >= 0.8 * ceil
            what = (f"{ours:.0f} = {ours / ceil:.0%} of the ceiling {ceil:.0f} (2x webdataset = {2 * wds:.0f} is above "
                    f"it; vs webdataset {ours / wds:.2f}x)")
        out.append(f"| RAW, 2 workers, {size} shards: >= 2x webdataset, or >= 80% of the ceiling where 2x is above it "
                   f"| {what} | {'yes' if met else 'NO'} |")
    for size in info:
        ours, wds = _median(runs[f"shardify/{size}"], "ttfb_s"), _median(runs[f"webdataset/{size}"], "ttfb_s")
        out.append(f"| first batch, {size} shards: <= webdataset's + 0.3 s | {ours:.2f} s vs {wds:.2f} s "
                   f"(+0.3 = {wds + 0.3:.2f}) | {'yes' if ours <= wds + 0.3 else 'NO'} |")
    for size, c in counts.items():
        kinds = ", ".join(f"{k} {v}" for k, v in c["kinds"].items())
        out.append(f"| start-up requests before the first batch, {size} shards ({info[size]['num_shards']} shards): "
                   f"bounded, no listing | {c['before_first_batch']} ({kinds}); {c['epoch']} in the epoch | "
                   f"{'yes' if c['kinds']['listing'] == 0 else 'NO'} |")
    return out


def write_results(path: Path, runs: dict[str, list[dict[str, Any]]], counts: dict[str, Any], info: dict[str, Any],
                  args: argparse.Namespace, load_start: tuple[float, float, float], torch: str) -> None:
    """Write the run's table, targets and set-up to `path` (and print the targets)."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    first = next(iter(info.values()))
    lines = [
        "# Object storage: shardify RAW vs WebDataset vs the server's ceiling (issue 11)", "",
        f"Run {when}: `python -m benchmarks.bench_s3 --num-images {args.num_images} --repeats {args.repeats} "
        f"--epochs {args.epochs}`; local SeaweedFS (tools/s3_server.py) on this machine, {first['num_samples']} "
        f"ImageNet-like JPEGs ({first['bytes_per_sample'] / 1e3:.0f} KB mean sample) as tar shards of 64 MB and 256 MB "
        f"(the same images, `shardify write --shuffle`), uploaded byte for byte; batch {args.batch_size}, "
        f"{args.num_workers} workers, persistent workers, torch {torch}; medians of {args.repeats} interleaved rounds, "
        "each loader run in a fresh process.", "",
        machine_markdown() + f" Load average at the start: {', '.join(f'{x:.1f}' for x in load_start)} on "
        f"{os.cpu_count()} cores shared with other engineers' work; the server, the client and the loaders share "
        "those cores.", "",
        *_rows(runs, info), "",
        "## Targets (issue 11, items 2 and 3)", "",
        *_targets(runs, counts, info), "",
        "## How it is measured", "",
        f"- Ceiling: {args.ceiling_threads} threads of boto3 whole-object GETs over every shard, {args.epochs} "
        "passes, bodies streamed in 1 MiB chunks and dropped; samples/s = bytes/s over the mean sample's bytes.",
        "- shardify: `make_loader(s3://..., batch_size, num_workers=2, decode=None, tail='pad')` with its "
        "defaults (benchmarks/loader_peers.py); webdataset: `WebDataset(urls, shardshuffle=100).shuffle(1000)` "
        "+ `WebLoader`, its URLs opened through fsspec/s3fs (8 MiB blocks). \"later epochs\": the passes after the "
        "first; first batch: from building the loader (library imported) to the first batch.",
        "- Start-up requests: one untimed shardify run through tools/delay_proxy.py (no delay), counting request "
        "lines until the first batch arrives (2 workers: both workers' first windows are in flight).", "",
    ]
    path.write_text("\n".join(lines))
    print("\n".join(_targets(runs, counts, info)))
