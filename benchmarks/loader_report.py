"""The loader benchmark's results page: every row, then each target against the best peer."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from tools.machine import machine_markdown

PEERS = ("webdataset", "imagefolder", "streaming", "litdata", "plain")  # plain: ImageFolder's shape, no venv
FOLDER_PEERS = ("imagefolder", "plain")
PER_SAMPLE = ("views", "to_list", "to_list, before")  # loader_child.FORMS after "packed"



def _quiet_or_not(load_start: tuple[float, float, float]) -> str:
    """A quiet machine: under one runnable process a minute before the run began."""
    if load_start[0] < 1.0:
        return "a quiet machine (nothing else ran; the load column is this benchmark's own processes)."
    return "shared with other work while this ran (the load column): read the ratios."

def _split(name: str) -> tuple[str, str, str, str]:
    loader, torch_version, task, variant = name.split("/")
    return loader, torch_version, task, variant


def _rows(res: dict[str, Any], task: str, variant: str, loaders: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in res.items()
            if _split(name)[2] == task and _split(name)[3] == variant and _split(name)[0] in loaders}


def _best(rows: dict[str, dict[str, Any]], key: str, lowest: bool = False) -> tuple[str, float] | None:
    if not rows:
        return None
    pick = min if lowest else max
    name = pick(rows, key=lambda n: rows[n][key])
    return _split(name)[0], rows[name][key]


def _shardify(res: dict[str, Any], task: str, variant: str, peers_torch: bool = False) -> dict[str, Any] | None:
    for name, r in res.items():
        loader, torch_version, t, v = _split(name)
        if loader == "shardify" and t == task and v == variant and (torch_version == "2.14.1") == peers_torch:
            return r
    return None


def targets(res: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for issue 11's targets, each against the best peer of the same run."""
    out: list[tuple[str, str, str]] = []

    def add(target: str, measured: str, ok: bool | None) -> None:
        out.append((target, measured, "n/a" if ok is None else ("yes" if ok else "NO")))

    raw, best = _shardify(res, "raw", "local"), _best(_rows(res, "raw", "local", PEERS), "samples_per_s")
    for mode in ("", ", reuse_buffers"):
        ours = _shardify(res, "raw", f"local{mode}")
        if ours and best:
            ratio = ours["samples_per_s"] / best[1]
            add(f"RAW, 2 workers{mode or ' (default: reader threads, copying)'}, >= 3x the best peer (later epochs)",
                f"{ours['samples_per_s']:.0f} vs {best[0]} {best[1]:.0f}: {ratio:.2f}x; per CPU-s "
                f"{ours['samples_per_cpu_s']:.0f} vs {_best(_rows(res, 'raw', 'local', PEERS), 'samples_per_cpu_s')[1]:.0f}",
                ratio >= 3)
    procs = _shardify(res, "raw", "local, processes")
    if procs and best:
        add("(info) RAW, 2 worker processes (worker_mode='processes', the mode before), vs the best peer",
            f"{procs['samples_per_s']:.0f} vs {best[0]} {best[1]:.0f}: {procs['samples_per_s'] / best[1]:.2f}x", None)
    raw = _shardify(res, "raw", "local, reuse_buffers") or raw  # the fastest mode, for what follows
    first = _best(_rows(res, "raw", "local", PEERS), "first_epoch_samples_per_s")
    if raw and first:
        r1 = raw["first_epoch_samples_per_s"] / first[1]
        add("(info) RAW, 2 workers (reuse_buffers), first epoch vs the best peer's first epoch",
            f"{raw['first_epoch_samples_per_s']:.0f} vs {first[0]} {first[1]:.0f}: {r1:.2f}x", None)
    single, mix = _shardify(res, "raw", "local"), _shardify(res, "raw", "local, 2-source mix")
    if single and mix:  # the same default mode, the same images: the cost of mixing itself
        cost = 1 - mix["samples_per_s"] / single["samples_per_s"]
        add("RAW, a 2-source mixture costs < 10% of the one-dataset rate (same images)",
            f"{mix['samples_per_s']:.0f} vs {single['samples_per_s']:.0f}: {cost:+.1%}", cost < 0.10)
    cache = next((r for n, r in res.items() if n.startswith("page cache/")), None)
    if raw and cache:
        share = raw["samples_per_s"] / cache["samples_per_s"]
        add("(stretch) RAW, 2 workers, >= 1/3 of the page-cache read rate",
            f"{raw['samples_per_s']:.0f} vs {cache['samples_per_s']:.0f}: {share:.2f}", share >= 1 / 3)
    folder0 = _best(_rows(res, "raw", "local, 0 workers", FOLDER_PEERS), "samples_per_s")
    for mode in ("", ", reuse_buffers"):
        w0 = _shardify(res, "raw", f"local, 0 workers{mode}")
        if w0 and folder0:
            ok = w0["first_epoch_samples_per_s"] >= folder0[1] and w0["samples_per_s"] >= folder0[1]
            add(f"RAW, 0 workers{mode}, >= ImageFolder's rate, already in the first epoch",
                f"first epoch {w0['first_epoch_samples_per_s']:.0f}, later {w0['samples_per_s']:.0f} vs "
                f"ImageFolder {folder0[1]:.0f}", ok)
    for task in ("raw", "decode"):
        ours, low = _shardify(res, task, "local", peers_torch=True), _best(
            _rows(res, task, "local", PEERS), "peak_pss_mib", lowest=True)
        if ours and low:
            add(f"peak PSS, {task.upper()}, shardify under the peers' torch <= the lowest peer",
                f"{ours['peak_pss_mib']:.0f} vs {low[0]} {low[1]:.0f} MiB", ours["peak_pss_mib"] <= low[1])
    big, small = _shardify(res, "raw", "local x4"), _shardify(res, "raw", "local")  # one mode, two sizes
    if big and small:
        grow = big["peak_pss_mib"] / small["peak_pss_mib"]
        add("peak PSS flat as the dataset grows 4x (within 10%)", f"{grow:.2f}x", grow <= 1.10)
    dec, fastest = _shardify(res, "decode", "local"), _best(_rows(res, "decode", "local", PEERS), "ttfb_s", lowest=True)
    if dec and fastest:
        add("first batch, DECODE, batch 256 <= the best peer's",
            f"{dec['ttfb_s']:.2f} s vs {fastest[0]} {fastest[1]:.2f} s", dec["ttfb_s"] <= fastest[1])
    b32 = _shardify(res, "decode", "local, batch 32")
    if b32:
        add("first batch, DECODE, batch 32 < 0.3 s", f"{b32['ttfb_s']:.2f} s", b32["ttfb_s"] < 0.3)
    best_dec = _best(_rows(res, "decode", "local", PEERS), "samples_per_s")
    if dec and best_dec:
        add("(info) DECODE, 2 workers, vs the best peer", f"{dec['samples_per_s']:.0f} vs {best_dec[0]} "
            f"{best_dec[1]:.0f}: {dec['samples_per_s'] / best_dec[1]:.2f}x", None)
    s3, wds = _shardify(res, "raw", "s3"), res.get(next((n for n in res if n.startswith("webdataset/") and
                                                        n.endswith("/raw/s3")), ""), None)
    if s3 and wds:
        ratio = s3["samples_per_s"] / wds["samples_per_s"]
        add("S3 RAW, 2 workers, >= 2x webdataset's S3 rate", f"{ratio:.2f}x", ratio >= 2)
        add("S3 first batch <= webdataset's + 0.3 s", f"{s3['ttfb_s']:.2f} s vs {wds['ttfb_s']:.2f} s",
            s3["ttfb_s"] <= wds["ttfb_s"] + 0.3)
    slow = _shardify(res, "raw", "s3+50ms")
    if s3 and slow:
        keep = slow["samples_per_s"] / s3["samples_per_s"]
        add("S3 +50 ms/request >= 80% of our no-delay S3 rate", f"{keep:.2f}", keep >= 0.8)
    return out


def per_sample_targets(res: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for issue 25's: shardify's RAW rows consumed per sample."""
    out: list[tuple[str, str, str]] = []

    def add(target: str, measured: str, ok: bool | None) -> None:
        out.append((target, measured, "n/a" if ok is None else ("yes" if ok else "NO")))

    for name, r in res.items():
        loader, _, task, variant = _split(name)
        if loader == "shardify" and task == "raw" and "samples_per_s views" in r:
            share = r["samples_per_s views"] / r["samples_per_s"]
            add(f"views within 15% of the packed rate ({variant}, {_split(name)[1]})",
                f"{r['samples_per_s views']:.0f} vs {r['samples_per_s']:.0f}: {share:.2f}", share >= 0.85)
            gain = r["samples_per_s to_list"] / r["samples_per_s to_list, before"]
            add(f"to_list >= 1.5x the copy before ({variant}, {_split(name)[1]})",
                f"{r['samples_per_s to_list']:.0f} vs {r['samples_per_s to_list, before']:.0f}: {gain:.2f}x",
                gain >= 1.5)
    folder0 = _best(_rows(res, "raw", "local, 0 workers", FOLDER_PEERS), "samples_per_s")
    w0 = _shardify(res, "raw", "local, 0 workers")
    if w0 and folder0 and "samples_per_s views" in w0:
        for form in ("views", "to_list"):
            ours = w0[f"samples_per_s {form}"]
            add(f"RAW, 0 workers, per sample ({form}) >= {folder0[0]}'s rate",
                f"{ours:.0f} vs {folder0[1]:.0f}: {ours / folder0[1]:.2f}x", ours >= folder0[1] if form == "views" else None)
    best = _best(_rows(res, "raw", "local", PEERS), "samples_per_s")
    ours2 = _shardify(res, "raw", "local")
    if ours2 and best and "samples_per_s views" in ours2:
        for form in ("views", "to_list"):
            ratio = ours2[f"samples_per_s {form}"] / best[1]
            add(f"RAW, 2 workers, per sample ({form}) >= 3x the best peer",
                f"{ours2[f'samples_per_s {form}']:.0f} vs {best[0]} {best[1]:.0f}: {ratio:.2f}x",
                ratio >= 3 if form == "views" else None)
    return out


def _form(r: dict[str, Any], form: str) -> str:
    return f"{r[f'samples_per_s {form}']:.0f}" if f"samples_per_s {form}" in r else "-"


def _data_set(args: argparse.Namespace) -> str:
    quality = getattr(args, "quality", 88)
    return "" if quality == 88 else f", {args.num_images:,} JPEGs at quality {quality} (smaller samples)"


def _flags(args: argparse.Namespace) -> str:
    names = ("quality", "no_peers_venv", "no_x4")
    return "".join(f" --{n.replace('_', '-')}" + ("" if getattr(args, n) is True else f" {getattr(args, n)}")
                   for n in names if getattr(args, n, None) not in (None, False, 88))


def write_results(path: Path, res: dict[str, Any], args: argparse.Namespace, load_start: tuple[float, ...]) -> None:
    lines = [
        "# Loader benchmark: shardify against the best peer" + _data_set(args),
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: `python -m benchmarks.bench_loader "
        f"--num-images {args.num_images}{_flags(args)} --epochs {args.epochs} --decode-epochs {args.decode_epochs} "
        f"--repeats {args.repeats}{' --raw-only' if getattr(args, 'raw_only', False) else ''}"
        f"{' --no-s3' if getattr(args, 'no_s3', False) else ''}`; {args.num_workers} workers unless the row says otherwise, batch "
        f"{args.batch_size}, persistent workers; medians of {args.repeats} runs for the RAW rows and the "
        f"first-batch rows, {min(args.peer_repeats, args.repeats)} for DECODE and x4; every configuration "
        "runs once per round, rounds interleaved, each run in a fresh process.",
        "",
        machine_markdown(),
        f" Load average at the start: {', '.join(f'{x:.1f}' for x in load_start)} on {os.cpu_count()} cores: "
        + _quiet_or_not(load_start),
        "",
        "| loader | torch | task | source | epoch 1 samples/s | later epochs samples/s | views samples/s "
        "| to_list samples/s | to_list before samples/s | MB/s | samples per CPU-s "
        "| first batch (s) | peak PSS (MiB) | load | runs (samples/s) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in res.items():
        loader, torch_version, task, variant = _split(name)
        lines.append(f"| {loader} | {torch_version} | {task} | {variant} | {r['first_epoch_samples_per_s']:.0f} | "
                     f"{r['samples_per_s']:.0f} | {' | '.join(_form(r, f) for f in PER_SAMPLE)} | {r['mb_per_s']:.1f} | {r['samples_per_cpu_s']:.0f} | "
                     f"{r['ttfb_s']:.2f} | {r['peak_pss_mib']:.0f} | {r['load']:.1f} | "
                     f"{', '.join(map(str, r['runs']))} |")
    lines += ["", "## Targets (issue 11), each against the best peer of this run", "",
              "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {ok} |" for t, m, ok in targets(res)]
    lines += ["", "## Targets (issue 25): the per-sample form, each against the best peer of this run", "",
              FORMS_NOTE, "", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {ok} |" for t, m, ok in per_sample_targets(res)]
    lines += ["", NOTES.strip()]
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


FORMS_NOTE = ("Forms: \"later epochs\" is shardify's packed form (PackedBytes as delivered); \"views\" walks "
              "every sample's zero-copy memoryview (`for v in batch['jpg']`), \"to_list\" copies each into "
              "`bytes` (`batch['jpg'].to_list()`), \"to_list before\" is the copy before this change (the "
              "whole buffer into one `bytes`, then a slice per sample). The peers' batches are per-sample "
              "bytes already: their one rate is their per-sample form. Each form runs its own epochs in the "
              "same process, in turn (benchmarks/loader_child.py); peak PSS covers every form.")

NOTES = """
## How the peers are set up

- Every peer reads the same 10k JPEGs in its own format, written from the same folder: shardify
  and webdataset the tar shards (`shardify write --shard-size 64MB --shuffle`), MosaicML Streaming
  its MDS shards (`MDSWriter`, columns jpg: bytes, cls: int, 64 MB), LitData its chunks
  (`litdata.optimize`, 64 MB), ImageFolder the files. Same batch size, workers, persistent workers
  and epochs for all. "epoch 1" is the first pass; "later epochs" the passes after it. Time to
  first batch counts from after the library's import (opening the dataset, starting workers,
  the first batch).
- The peers run in benchmarks/.peers-venv (torch 2.14.1 + torchvision 0.29.1, built once by
  benchmarks/peers_env.py); shardify runs both in the project's venv (the rows marked with the
  project's torch) and there (torch 2.14.1), the latter for the memory comparison under one torch.
- webdataset: `WebDataset(urls, shardshuffle=100, nodesplitter=split_by_node).shuffle(1000)`,
  `.to_tuple("jpg", "cls").batched(256)`, `WebLoader(batch_size=None)`; DECODE with PIL and a
  numpy RandomResizedCrop. Streaming: `StreamingDataset(local=..., shuffle=True, batch_size=256)`
  + `DataLoader`. LitData: `StreamingDataset(input_dir, shuffle=True)` + `StreamingDataLoader`.
  ImageFolder: `torchvision.datasets.ImageFolder` (raw bytes loader for RAW) + `DataLoader(shuffle=True)`.
  DECODE for those three: PIL, torchvision `RandomResizedCrop(224)`, `RandomHorizontalFlip`,
  `PILToTensor` (uint8 CHW, as shardify delivers). RAW batches of the peers are lists of bytes.
- plain (the rows of runs with `--no-peers-venv`, when the peers' venv is not built): ImageFolder's
  shape in the project's venv, without torchvision: a `Dataset` of one file per sample (opened and
  read in `__getitem__`) + `DataLoader(shuffle=True)`, batches of per-sample bytes.
- shardify: `make_loader(url, batch_size=256, num_workers=2, tail="pad")` with its defaults;
  padding repeats are not counted. RAW (decode=None) on tar shards runs its num_workers as reader
  threads in the main process by default (worker_mode="auto"; the "processes" row forces DataLoader
  worker processes, the mode before): windows read with os.preadv into reused buffers, each
  batch's PackedBytes gathered by index into a tensor the caller may keep (the default, copying)
  or into a reused slab (the `reuse_buffers` rows, valid until the next batch; the stretch and
  page-cache targets are judged on the fastest mode; see README, "Raw bytes at memory speed").
  verify_checksums=True (the default) hashes every sample read.
- page cache: the tar shards read front to back into one reused 16 MiB buffer in one process:
  the machine's ceiling for RAW bytes, in samples/s.
- Warm page cache: before each run the harness reads that loader's own files once, untimed (this
  VM's memory manager evicts files between runs, so a first epoch would otherwise be partly a disk
  benchmark, unequally across loaders). "epoch 1" is then the loader's own first-pass cost.
- Peak PSS is the whole process tree (main + workers), sampled every 0.25 s.
- The load column is the load average around each run: where other jobs shared the cores, wall-clock
  rates move with that load, ratios less because runs are interleaved; "samples per CPU-s" divides by the CPU time of the
  loader's own process tree.
"""


def write_mix_results(path: Path, res: dict[str, Any], args: argparse.Namespace,
                      load_start: tuple[float, ...]) -> None:
    """results_mix.md: RAW throughput of one dataset vs the same images as a 1:1 two-source mixture."""
    single = _shardify(res, "raw", "local")
    mix = _shardify(res, "raw", "local, 2-source mix")
    assert single and mix
    cost = 1 - mix["samples_per_s"] / single["samples_per_s"]
    lines = [
        "# Mixing benchmark: a 2-source mixture against one dataset (RAW)",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: `python -m benchmarks.bench_loader --mix "
        f"--num-images {args.num_images} --epochs {args.epochs} --repeats {args.repeats}`; {args.num_workers} "
        f"workers, batch {args.batch_size}, decode=None (RAW: the loader's own cost, no JPEG decode); medians of "
        f"{args.repeats} runs, rows interleaved round by round, each run in a fresh process.",
        "",
        machine_markdown(),
        f" Load average at the start: {', '.join(f'{x:.1f}' for x in load_start)} on {os.cpu_count()} cores: "
        + _quiet_or_not(load_start),
        "",
        f"Data: {args.num_images} synthetic ImageNet-like JPEGs as one tar dataset, and the same images as two "
        "datasets (half the class folders each) mixed 1:1 (`make_loader([a, b], weights=[1, 1])`): every "
        "epoch reads the same bytes either way, so the difference is the mixing itself (the mixture plan, "
        "one reader per source behind one prefetch budget, the per-sample source index).",
        "",
        "| loader | epoch 1 samples/s | later epochs samples/s | MB/s | samples per CPU-s | first batch (s) "
        "| peak PSS (MiB) | load | runs (samples/s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in res.items():
        lines.append(f"| {_split(name)[3]} | {r['first_epoch_samples_per_s']:.0f} | {r['samples_per_s']:.0f} | "
                     f"{r['mb_per_s']:.1f} | {r['samples_per_cpu_s']:.0f} | {r['ttfb_s']:.2f} | "
                     f"{r['peak_pss_mib']:.0f} | {r['load']:.1f} | {', '.join(map(str, r['runs']))} |")
    cpu_cost = 1 - mix["samples_per_cpu_s"] / max(1e-9, single["samples_per_cpu_s"])
    lines += ["", f"Mixing cost, later epochs: wall clock {cost:+.1%} of the one-dataset rate (ratio "
              f"{mix['samples_per_s'] / single['samples_per_s']:.3f}; target < 10%: "
              f"{'met' if cost < 0.10 else 'NOT met'}); CPU per sample {cpu_cost:+.1%} (samples per CPU-second of "
              "the loader's whole process tree, ratio "
              f"{mix['samples_per_cpu_s'] / max(1e-9, single['samples_per_cpu_s']):.3f}).",
              "",
              "On a shared machine the wall-clock rates follow the load (see the runs column: the same "
              "configuration varies by tens of percent between rounds), so the CPU per sample, which "
              "counts only the loader's own work, is the steadier measure of what mixing costs."]
    path.write_text("\n".join(lines) + "\n")
