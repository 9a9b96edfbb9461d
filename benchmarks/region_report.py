"""The markdown of bench_region's run, put at the top of benchmarks/results_decode.md (newest first)."""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path
from typing import Any

from tools.machine import machine_markdown

FULL = "decode only: simplejpeg, full size"
LOADER_SET = "loader's (tools.make_synthetic)"
TODAY, OURS, PEER = "RRC: today (simplejpeg scaled decode + crop)", "RRC: region decode", "RRC: webdataset-style"
OURS_LIBJPEG = "RRC: region decode, libjpeg's entropy decoder"  # the region path before _fasthuff.h

MARK = "<!-- runs above: bench_region.py; below: bench_decode.py -->"


def _single_table(rows: dict[str, Any]) -> list[str]:
    today = rows[TODAY]["median"]
    lines = ["| path | images per CPU-s | vs today | passes |", "|---|---:|---:|---|"]
    for name, row in rows.items():
        ratio = f"{row['median'] / today:.2f}x" if name != FULL else ""
        lines.append(f"| {name} | {row['median']:,.0f} | {ratio} | {', '.join(map(str, row['runs']))} |")
    return lines


def _targets(single: dict[str, Any], loader: dict[str, Any] | None) -> list[str]:
    limit = 2 * single.get(LOADER_SET, single["~500x375 baseline"])[FULL]["median"]
    if loader is None:
        return [f"This machine's full-decode limit (simplejpeg full-size decode per core x 2, on the loader's images where present): {limit:,.0f} images/s."]
    ours, today, peer = (loader[k] for k in ("shardify, region decode", "shardify, today (region off)", "webdataset"))

    def vs(a: dict[str, Any], b: dict[str, Any]) -> str:
        return (f"{a['median']:,.0f} vs {b['median']:,.0f} samples/s: {a['median'] / b['median']:.2f}x; per CPU-s "
                f"{a['per_cpu_s']:,.0f} vs {b['per_cpu_s']:,.0f}: {a['per_cpu_s'] / b['per_cpu_s']:.2f}x")
    rows = [("firm: DECODE >= 1.3x today's code (same run)", vs(ours, today), ours["median"] >= 1.3 * today["median"]),
            ("firm: DECODE above the full-decode limit (full decode of the loader's images per core x 2)",
             f"{ours['median']:,.0f} vs {limit:,.0f}: {ours['median'] / limit:.2f}x; per CPU-s {ours['per_cpu_s']:,.0f} "
             f"vs {limit / 2:,.0f}", ours["median"] > limit),
            ("stretch: DECODE >= 2x the best peer run here (webdataset)", vs(ours, peer),
             ours["median"] >= 2 * peer["median"])]
    return ["| target | measured | met |", "|---|---|---|",
            *[f"| {t} | {m} | {'yes' if ok else 'no'} |" for t, m, ok in rows]]


def _quiet_or_not(load_start: tuple[float, float, float]) -> str:
    """A quiet machine: under one runnable process a minute before this began (the benchmark's own
    processes make the load at the end)."""
    if load_start[0] < 1.0:
        return "a quiet machine (nothing else ran; the load at the end is this benchmark's own processes)."
    return ("**the cores were shared with other work while this ran**, so read the ratios (all rows run "
            "interleaved in one run); a re-run on a quiet machine is due.")


def render(single: dict[str, Any], loader: dict[str, Any] | None, args: argparse.Namespace,
           load_start: tuple[float, float, float]) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    loads = f"{', '.join(f'{x:.1f}' for x in load_start)} at the start, {', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end"
    out = [f"# Region decode (bench_region.py), {when}", "",
           f"{machine_markdown()} Load average {loads}: {_quiet_or_not(load_start)}", "",
           f"`python -m benchmarks.bench_region --num-images {args.num_images} --repeats {args.repeats} "
           f"--loader-repeats {args.loader_repeats}`. RRC = RandomResizedCrop(224, scale (0.08, 1), ratio (3/4, 4/3)) "
           "+ flip; images per CPU-second of the process (torch and DALI on one thread), median of the "
           "interleaved passes listed.", ""]
    for label in [k for k in single if k not in ("scale parity", "parts")]:
        out += [f"### One core, {label} JPEGs", "", *_single_table(single[label]), ""]
    if "parts" in single:
        out += ["### Where one image's CPU time goes (region path; the loader's JPEGs where present, else the baseline set)", "",
                "| step | us per image, one core |", "|---|---:|",
                *[f"| {name.strip()} | {us:,.0f} |" for name, us in single["parts"].items()], "",
                "Entropy (Huffman) decoding cannot skip a row above the window's bottom edge nor a column beside it "
                "(no restart markers): it is the floor of any region decode of these files; the extension's own "
                "Huffman decoder (dataio/decode/_fasthuff.h) does it in less time than libjpeg's, same coefficients.", ""]
    count, mean, worst = single["scale parity"]
    out += ["### Pixels", "",
            "At DCT scale 1 the region-decoded window equals the full decode's window bit for bit (tests/dataio/"
            "test_decode_region.py, every chroma layout, greyscale, progressive; the decoded region is widened by one "
            "column each side so fancy upsampling's edge columns fall outside the window). It also equals today's "
            f"scaled decode at 1/2, 1/4, 1/8. Against a full-size decode + crop + the same antialiased resize, the {count} "
            f"crops of 20 ~1600x1200 JPEGs that decode at a reduced scale differ by {mean:.2f} grey levels on average "
            f"(mean absolute difference; worst crop {worst:.2f}): the DCT scaling's own effect, as before.", ""]
    if loader is not None:
        out += ["### Loader, DECODE, 2 workers, batch 256, 10k ImageNet-like JPEGs (tools.make_synthetic)", "",
                "| loader | samples/s (median) | samples per CPU-s (median) | runs | load during runs |",
                "|---|---:|---:|---|---|",
                *[f"| {n} | {r['median']:,.0f} | {r['per_cpu_s']:,.0f} | {', '.join(map(str, r['runs']))} | "
                  f"{', '.join(map(str, r['load']))} |" for n, r in loader.items()], "",
                "Each run is a fresh process (benchmarks.bench_loader.run_child, 2 epochs, the second timed); samples "
                "per CPU-s count the CPU time of the loader's whole process tree (workers included), which other "
                "load on the machine changes much less than samples/s; "
                "\"today\" is the same code with the extension switched off in that process; \"fresh buffers\" is "
                "the region path with pooled_buffers=False (fresh memory per batch, as before the pooled DECODE "
                "buffers). The peers that need "
                "benchmarks/.peers-venv (ImageFolder, Streaming, LitData: PIL + torchvision, like webdataset's "
                "DECODE) were not run here.", ""]
    out += ["### Targets (issue 23)", "", *_targets(single, loader), ""]
    return "\n".join(out)


def prepend_report(path: Path, single: dict[str, Any], loader: dict[str, Any] | None, args: argparse.Namespace,
                   load_start: tuple[float, float, float]) -> None:
    """Write this run's section above the previous ones (newest first)."""
    old = path.read_text() if path.exists() else ""
    path.write_text(render(single, loader, args, load_start) + "\n" + (old if MARK in old else f"{MARK}\n\n{old}"))
