"""The fault-injection suite: each scenario's figure and pass/fail, written to benchmarks/results_faults.md.

    python -m tools.faults            # the full suite (a few minutes), `make faults`
    python -m tools.faults --short    # the small form CI runs through tests/tools/test_faults.py

Scenarios run against a local SeaweedFS (tools.s3_server) behind tools.delay_proxy: loader
epochs through 503s, resets, truncated bodies and 2-second stalls (every sample exactly once?
throughput against no fault, with and without hedged reads); `shardify write` through failing
PUTs (a complete dataset or a clean failure, never a false success); kill -9 of `shardify write`
mid-write (locally and on S3: no manifest over a partial dataset, and a rerun completes);
corrupted shards (one byte of one sample, same size), indexes and cache entries; a truncated newest checkpoint under
`--resume auto`; kill -9 and SIGSTOP of a trainer rank under `torchrun --max-restarts`
(committed steps exactly once; time to detect). Pass/fail judges correctness only; throughput ratios are reported, never
asserted.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tools.faults.common import FULL, ROOT, SHORT, Row
from tools.faults.corrupt import corruption_scenarios
from tools.faults.loader import loader_scenarios
from tools.faults.training import checkpoint_scenarios, trainer_rank_scenarios
from tools.faults.write import kill_scenarios, write_scenarios

RESULTS = ROOT / "benchmarks" / "results_faults.md"


def run_suite(server: Any, workdir: Path, *, short: bool, seed: int = 1,
              groups: tuple[str, ...] = ("loader", "write", "kill", "corrupt", "checkpoint", "trainer"),
              loader_faults: tuple[str, ...] = (), epochs: int | None = None) -> list[Row]:
    """Every scenario of `groups` against `server` (an S3Server); rows in order. loader_faults: run only
    the loader faults whose name holds one of these words; epochs: loader rounds instead of the form's."""
    size = SHORT if short else FULL
    if epochs is not None:
        size = replace(size, epochs=epochs)
    workdir.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    if "loader" in groups:
        rows += loader_scenarios(server, size, seed, loader_faults)
    if "write" in groups:
        rows += write_scenarios(server, size, workdir, seed)
    if "kill" in groups:
        rows += kill_scenarios(server, size, workdir, seed)
    if "corrupt" in groups:
        rows += corruption_scenarios(workdir, size, seed)
    if "checkpoint" in groups:
        rows += checkpoint_scenarios(workdir)
    if "trainer" in groups:
        rows += trainer_rank_scenarios(workdir, size, seed)
    return rows


def to_markdown(rows: list[Row], *, short: bool, machine: str, seconds: float) -> str:
    lines = [
        "# Fault-injection suite (`make faults` = `python -m tools.faults`)",
        "",
        f"Form: {'short (CI)' if short else 'full'}; {seconds:.0f} s in all. Machine: {machine}.",
        "Pass/fail judges correctness only (exactly once, complete or clean failure, refused corruption);",
        "throughput figures are reported, never asserted. Faults come from tools/delay_proxy.py in front",
        "of a local SeaweedFS (fixed seed), so both ends share this machine's cores.",
        "",
        "| group | scenario | figure | pass | note |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.group} | {r.scenario} | {r.figure} | {'PASS' if r.passed else 'FAIL'} | "
                     f"{r.note.replace('|', '/')} |")
    failed = [r for r in rows if not r.passed]
    lines += ["", f"{len(rows) - len(failed)} of {len(rows)} scenarios pass."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the suite against a fresh local SeaweedFS and write the results file; exit 1 if any scenario fails."""
    import tempfile

    from tools.machine import describe_machine
    from tools.s3_server import S3Server

    parser = argparse.ArgumentParser(prog="python -m tools.faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", action="store_true", help="the small CI form")
    parser.add_argument("--seed", type=int, default=1, help="the proxy's fault seed (runs are repeatable)")
    parser.add_argument("--groups", default="loader,write,kill,corrupt,checkpoint,trainer")
    parser.add_argument("--loader-faults", default="",
                        help="comma-separated words: only the loader faults whose name holds one (e.g. 'stalls'; "
                             "no fault always runs, as the base)")
    parser.add_argument("--epochs", type=int, default=None, help="loader rounds (default: the form's)")
    parser.add_argument("--out", default=str(RESULTS), help="results file (markdown)")
    args = parser.parse_args(argv)
    groups = tuple(g.strip() for g in args.groups.split(",") if g.strip())
    only = tuple(w.strip() for w in args.loader_faults.split(",") if w.strip())
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="shardify-faults-") as tmp, S3Server() as server:
        rows = run_suite(server, Path(tmp), short=args.short, seed=args.seed, groups=groups,
                         loader_faults=only, epochs=args.epochs)
    m = describe_machine()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    machine = f"{m['cpu']}, {m['cores']} cores, {m['memory']} RAM, load average {load} at the end"
    text = to_markdown(rows, short=args.short, machine=machine, seconds=time.perf_counter() - start)
    Path(args.out).write_text(text)
    print(text)
    return 0 if all(r.passed for r in rows) else 1
