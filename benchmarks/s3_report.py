"""benchmarks/results_s3.md from a bench_s3 run: the rows in every form, the ratios and the S3 targets
(issue 11; issue 25: the per-sample form, the first batch, 0 and 2 workers; issue 34: one epoch against
the server's ceiling and the best peer, CPU-seconds per GB and per 1,000 samples)."""

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
          "| first batch (s) | epoch 1 CPU-s/GB | later CPU-s/GB | epoch 1 CPU-s/1000 samples | server CPU-s/GB "
          "| peak PSS (MiB) | load | runs (samples/s) |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
CEILING_NAMES = {"ceiling": "server ceiling (whole-object GETs, boto3 threads)",
                 "curl1": "server ceiling (curl, 1 process, whole shards)",
                 "curl2": "server ceiling (curl, 2 processes, whole shards)"}
PEER_ORDER = ("webdataset", "s3torchconnector", "obstore")
PROCESSES = "shardify-processes"  # shardify with worker_mode="processes": DataLoader worker processes, as the peers
CPU_TARGET_S = 0.08  # CPU-seconds per 1,000 samples of ~100 KB (issue 34)


def _median(rs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rs)


def _each(rs: list[dict[str, Any]], key: str, fmt: str) -> str:
    return ", ".join(format(r[key], fmt) for r in rs)


def _cpu(rs: list[dict[str, Any]], key: str, bytes_per_sample: float, per: str) -> float:
    """CPU-seconds per GB of the dataset read (per="gb") or per 1,000 samples, from samples per CPU-second."""
    rate = _median(rs, key) if key in rs[0] else 0.0
    if rate <= 0:
        return float("nan")
    return 1000 / rate if per == "k" else 1e9 / (rate * bytes_per_sample)


def _server(rs: list[dict[str, Any]]) -> str:
    """The server's CPU-seconds per GB it served during these runs (median), '-' where not measured."""
    return f"{_median(rs, 'server_cpu_s_per_gb'):.2f}" if "server_cpu_s_per_gb" in rs[0] else "-"


def _loader_row(size: str, kind: str, workers: int, rs: list[dict[str, Any]], bytes_per_sample: float) -> str:
    forms = [f"{_median(rs, f'samples_per_s {form}'):.0f}" if f"samples_per_s {form}" in rs[0] else "-"
             for form in ("views", "to_list")]
    cpu = [_cpu(rs, "first_epoch_samples_per_cpu_s", bytes_per_sample, "gb"),
           _cpu(rs, "samples_per_cpu_s", bytes_per_sample, "gb"),
           _cpu(rs, "first_epoch_samples_per_cpu_s", bytes_per_sample, "k")]
    what = f"shardify RAW, {workers} worker processes" if kind == PROCESSES else f"{kind} RAW, {workers} workers"
    return (f"| {size} | {what} | {_median(rs, 'first_epoch_samples_per_s'):.0f} | "
            f"{_median(rs, 'samples_per_s'):.0f} | {forms[0]} | {forms[1]} | {_median(rs, 'mb_per_s'):.0f} | "
            f"{_median(rs, 'ttfb_s'):.2f} | {cpu[0]:.2f} | {cpu[1]:.2f} | {cpu[2]:.3f} | {_server(rs)} | "
            f"{_median(rs, 'peak_pss_mib'):.0f} | {_median(rs, 'load'):.1f} | {_runs(rs)} |")


def _runs(rs: list[dict[str, Any]]) -> str:
    """Each run's epoch-1 and later-epochs rates; for shardify, each run's to_list rate too."""
    packed = f"epoch 1 {_each(rs, 'first_epoch_samples_per_s', '.0f')}; later {_each(rs, 'samples_per_s', '.0f')}"
    return packed if "samples_per_s to_list" not in rs[0] else \
        f"{packed}; to_list {_each(rs, 'samples_per_s to_list', '.0f')}"


def _peers(runs: dict[str, list[dict[str, Any]]], size: str, workers: int) -> list[str]:
    return [k for k in PEER_ORDER if f"{k}/{size}/{workers}" in runs]


def _ceiling(runs: dict[str, list[dict[str, Any]]], size: str) -> tuple[str, float]:
    """The highest ceiling measured for `size` (name, samples/s): what the server can deliver."""
    got = [(CEILING_NAMES[k], _median(runs[f"{k}/{size}"], "samples_per_s")) for k in CEILING_NAMES
           if f"{k}/{size}" in runs]
    return max(got, key=lambda g: g[1])


def _table(runs: dict[str, list[dict[str, Any]]], info: dict[str, Any], workers: int) -> list[str]:
    """One worker count's table: per shard size the server's ceilings, then shardify and each peer."""
    out = list(HEADER)
    for size, d in info.items():
        for key, name in CEILING_NAMES.items():
            if f"{key}/{size}" not in runs:
                continue
            c = runs[f"{key}/{size}"]
            cpu = f"{_median(c, 'cpu_s_per_gb'):.2f}" if "cpu_s_per_gb" in c[0] else "-"
            out.append(f"| {size} ({d['num_shards']} shards) | {name} | - | {_median(c, 'samples_per_s'):.0f} | - | - | "
                       f"{_median(c, 'bytes_per_s') / 1e6:.0f} | - | - | {cpu} | - | {_server(c)} | - | "
                       f"{_median(c, 'load'):.1f} | "
                       f"{_each(c, 'samples_per_s', '.0f')} |")
        kinds = ["shardify", *_peers(runs, size, workers)]
        if f"{PROCESSES}/{size}/{workers}" in runs:
            kinds.insert(1, PROCESSES)
        for kind in kinds:
            out.append(_loader_row(size, kind, workers, runs[f"{kind}/{size}/{workers}"], d["bytes_per_sample"]))
    return out


def _best_peer(runs: dict[str, list[dict[str, Any]]], size: str, workers: int, key: str) -> tuple[str, float]:
    return max(((k, _median(runs[f"{k}/{size}/{workers}"], key)) for k in _peers(runs, size, workers)),
               key=lambda g: g[1])


def _cpu_bound(runs: dict[str, list[dict[str, Any]]], size: str, workers: int, bytes_per_sample: float,
              cores: int) -> str:
    """What the cores allow where the server shares them: cores / (server's + client's CPU-s per GB), for
    shardify's epoch 1 and for the curl ceiling it is compared with ('' where the server's CPU was not measured).
    Where both rates sit near their bounds, the distance between them is CPU per byte, not waiting."""
    ours, curl = runs[f"shardify/{size}/{workers}"], runs.get(f"curl2/{size}")
    if "server_cpu_s_per_gb" not in ours[0] or not curl or "server_cpu_s_per_gb" not in curl[0]:
        return ""
    mine = _cpu(ours, "first_epoch_samples_per_cpu_s", bytes_per_sample, "gb")
    served, curl_cpu = _median(ours, "server_cpu_s_per_gb"), _median(curl, "cpu_s_per_gb")
    curl_served = _median(curl, "server_cpu_s_per_gb")
    ours_max, curl_max = (cores * 1e9 / ((a + b) * bytes_per_sample)
                          for a, b in ((served, mine), (curl_served, curl_cpu)))
    return (f"; CPU on {cores} cores: server {served:.2f} + shardify {mine:.2f} CPU-s/GB allow {ours_max:.0f}/s, "
            f"server {curl_served:.2f} + curl {curl_cpu:.2f} allow {curl_max:.0f}/s: the bound's ratio "
            f"{ours_max / curl_max:.2f}")


def _throughput(runs: dict[str, list[dict[str, Any]]], size: str, workers: int,
                bytes_per_sample: float) -> list[tuple[str, str, bool]]:
    """(target, measured, met): one epoch against the ceiling; per sample against 2x the best peer."""
    ours = runs[f"shardify/{size}/{workers}"]
    ceiling_name, ceil = _ceiling(runs, size)
    bound = _cpu_bound(runs, size, workers, bytes_per_sample, os.cpu_count() or 1)
    epoch1 = _median(ours, "first_epoch_samples_per_s")
    peer1, peer1_rate = _best_peer(runs, size, workers, "first_epoch_samples_per_s")
    peer, peer_rate = _best_peer(runs, size, workers, "samples_per_s")
    to_list, views = _median(ours, "samples_per_s to_list"), _median(ours, "samples_per_s views")
    rows = [
        (f"RAW, {workers} workers, {size} shards, one epoch with start-up: >= 0.8 of the server's ceiling",
         f"{epoch1:.0f} = {epoch1 / ceil:.2f} of {ceil:.0f} ({ceiling_name}){bound}", epoch1 >= 0.8 * ceil),
        (f"RAW, {workers} workers, {size} shards, one epoch: >= 2x the best peer",
         f"{epoch1:.0f} vs {peer1} {peer1_rate:.0f}: {epoch1 / peer1_rate:.2f}x", epoch1 >= 2 * peer1_rate),
        (f"RAW, {workers} workers, {size} shards, per sample (to_list, later epochs): >= 2x the best peer",
         f"to_list {to_list:.0f} vs {peer} {peer_rate:.0f}: {to_list / peer_rate:.2f}x (views {views:.0f}, "
         f"{views / peer_rate:.2f}x)", to_list >= 2 * peer_rate),
    ]
    procs = runs.get(f"{PROCESSES}/{size}/{workers}")
    if procs:  # the peers' own form: worker processes, one bytes object per sample
        first, listed = _median(procs, "first_epoch_samples_per_s"), _median(procs, "samples_per_s to_list")
        rows.append((f"RAW, {workers} worker processes, {size} shards, one epoch and per sample (to_list, later "
                     "epochs): >= 2x the best peer", f"one epoch {first:.0f} vs {peer1} {peer1_rate:.0f}: "
                     f"{first / peer1_rate:.2f}x; to_list {listed:.0f} vs {peer} {peer_rate:.0f}: "
                     f"{listed / peer_rate:.2f}x", first >= 2 * peer1_rate and listed >= 2 * peer_rate))
    return rows


def _targets(runs: dict[str, list[dict[str, Any]]], counts: dict[str, Any], info: dict[str, Any],
             workers: tuple[int, ...]) -> list[str]:
    rows = [t for w in workers for size, d in info.items() for t in _throughput(runs, size, w, d["bytes_per_sample"])]
    for w in workers:
        for size, d in info.items():
            cpu = _cpu(runs[f"shardify/{size}/{w}"], "first_epoch_samples_per_cpu_s", d["bytes_per_sample"], "k")
            rows.append((f"CPU, {w} workers, {size} shards, one epoch: <= {CPU_TARGET_S} CPU-s per 1,000 samples",
                         f"{cpu:.3f} ({cpu * 1e6 / d['bytes_per_sample']:.2f} CPU-s/GB)", cpu <= CPU_TARGET_S))
            ours = _median(runs[f"shardify/{size}/{w}"], "ttfb_s")
            wds = _median(runs[f"webdataset/{size}/{w}"], "ttfb_s")
            rows.append((f"first batch, {w} workers, {size} shards: <= webdataset's",
                         f"{ours:.2f} s vs {wds:.2f} s ({wds / ours:.2f}x)", ours <= wds))
    for key, c in counts.items():
        size, w = key.split("/")
        kinds = ", ".join(f"{k} {v}" for k, v in c["kinds"].items())
        rows.append((f"start-up requests before the first batch, {size} shards ({info[size]['num_shards']} shards), "
                     f"{w} workers: bounded, no listing", f"{c['before_first_batch']} ({kinds}); {c['epoch']} in the "
                     "epoch", c["kinds"]["listing"] == 0))
    return ["| target | measured | met |", "|---|---|---|",
            *(f"| {t} | {m} | {'yes' if ok else 'NO'} |" for t, m, ok in rows)]


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
    sizes = " and ".join(info)
    https = getattr(args, "https", False)
    transport = "HTTPS (a self-signed certificate, trusted through AWS_CA_BUNDLE)" if https else "plain HTTP"
    peers = ", ".join(k for k in PEER_ORDER if any(name.startswith(f"{k}/") for name in runs))
    lines = [
        "# Object storage: shardify RAW vs its peers vs the server's ceiling (issues 11, 25 and 34)", "",
        f"Run {when}: `python -m benchmarks.bench_s3 --num-images {args.num_images} --repeats {args.repeats} "
        f"--epochs {args.epochs} --workers {','.join(map(str, args.workers))} --sizes {','.join(info)} "
        f"--peers {','.join(getattr(args, 'peers', ('webdataset',)))}{' --https' if https else ''}`; local SeaweedFS (tools/s3_server.py) "
        f"on this machine over {transport}, {first['num_samples']} ImageNet-like JPEGs "
        f"({first['bytes_per_sample'] / 1e3:.0f} KB mean sample) as tar shards of {sizes} (`shardify write "
        f"--shuffle`), uploaded byte for byte; peers {peers}; batch {args.batch_size}, persistent workers, torch "
        f"{torch}; medians of {args.repeats} interleaved rounds, each loader run in a fresh process.", "",
        machine_markdown() + " " + _load_note(load_start), "",
        "Forms: shardify's \"later epochs\" is its packed form (PackedBytes as delivered); \"views\" walks every "
        "sample's zero-copy memoryview (`for v in batch['jpg']`), \"to_list\" copies each into `bytes` "
        "(`batch['jpg'].to_list()`), the form code that needs `bytes` consumes. The peers' batches are lists of "
        "per-sample `bytes` already: their one rate is their per-sample form. CPU: user + system seconds of the "
        "loader's process and its workers (not the server's), per GB of the dataset read and per 1,000 samples; "
        "server CPU-s/GB: the SeaweedFS process's, per GB it served during the row's runs (same cores).",
        *tables, "",
        "## Targets (issue 11; issue 25, items 2 and 4; issue 34)", "", *targets, "",
        "## How it is measured", "",
        f"- Ceilings, in every round: {args.ceiling_threads} threads of boto3 whole-object GETs over every shard, "
        f"{args.epochs} passes, bodies streamed in 1 MiB chunks and dropped; curl (`--aws-sigv4`) fetching every "
        "shard whole to /dev/null with 1 and 2 processes (its CPU-s/GB: the curl processes'); samples/s = bytes/s "
        "over the mean sample's bytes. The targets read the highest.",
        "- shardify: `make_loader(s3://..., batch_size, num_workers, decode=None, tail='pad')` with its "
        "defaults (benchmarks/loader_peers.py); webdataset: `WebDataset(urls, shardshuffle=100).shuffle(1000)` "
        "+ `WebLoader`, its URLs opened through fsspec/s3fs (8 MiB blocks); s3torchconnector: "
        "`S3IterableDataset.from_objects(..., enable_sharding=True)` (the CRT client), each object's reader "
        "through tarfile, a 1000-sample shuffle; obstore: each worker's shards fetched by `obstore.get_ranges` in "
        "8 MiB parts, the next shard while one is parsed, tarfile, a 1000-sample shuffle (benchmarks/s3_peers.py). "
        "\"epoch 1\": the first pass, packed, start-up included; shardify's later passes cycle through the forms "
        "(one epoch each, benchmarks/loader_child.py), the peers' are their later passes; first batch: from "
        "building the loader (library imported) to the first batch.",
        "- Start-up requests: one untimed shardify run per worker count through tools/delay_proxy.py (no delay), "
        "counting request lines until the first batch arrives.", "",
    ]
    path.write_text("\n".join(lines))
    print("\n".join(targets))
