"""Token loading in one run: shardify's token loader against nanoGPT's np.memmap get_batch, LitData's
StreamingDataset + TokensLoader and Megatron-Core's GPTDataset, on the bundled corpus (the Python
docs, tokenized once); and the tokenization throughput of `shardify write` against `datasets.map`
with the same tokenizer.

    python -m benchmarks.bench_tokens [--copies 30] [--batches 60] [--rounds 3] [--no-peers]

Each configuration runs in a fresh child process, rounds interleaved, medians reported with the
runs. LitData, Megatron-Core and `datasets` run in benchmarks/.peers-venv (peers_env.py; litdata,
datasets, tokenizers and megatron-core added to it here). Results, with the machine described, go to
benchmarks/results_tokens.md. Not part of the tests or CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from tools.machine import machine_markdown
from tools.text_corpus import documents, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
PEER_EXTRAS = ("litdata", "datasets", "tokenizers", "megatron-core")


def prepare(work: Path, copies: int, vocab: int) -> dict[str, Any]:
    """The corpus (copies x the bundled documents) as JSON Lines, its tokenizer, the token dataset (timed
    `shardify write --workers 2`), and nanoGPT's train.bin (every shard's tokens concatenated)."""
    work.mkdir(parents=True, exist_ok=True)
    docs = documents()
    jsonl = write_jsonl(work / "corpus.jsonl", [{"id": f"{d['id']}#{c}", "text": d["text"]}
                                                for c in range(copies) for d in docs])
    tok, dest = work / "tokenizer.json", work / "tokens"
    shardify = [sys.executable, "-m", "sharding.cli"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not tok.exists():
        subprocess.run([*shardify, "tokenizer", "train", str(work / "corpus.jsonl"), "--vocab-size", str(vocab),
                        "-o", str(tok)], check=True, env=env)
    start = time.perf_counter()
    subprocess.run([*shardify, "write", str(jsonl), str(dest), "--tokenizer", str(tok), "--workers", "2",
                    "--tokens-per-shard", "1000000", "--overwrite", "--quiet"], check=True, env=env)
    write_s = time.perf_counter() - start
    manifest = json.loads((dest / "manifest.json").read_text())
    shards = [str(dest / p) for p in manifest["shards"]["path"]]
    num_tokens = sum(manifest["shards"]["num_tokens"])
    with open(work / "train.bin", "wb") as f:
        for shard in shards:
            f.write(Path(shard).read_bytes())
    return {"jsonl": str(jsonl), "tokenizer": str(tok), "url": str(dest), "shards": shards,
            "bin": str(work / "train.bin"),
            "num_tokens": num_tokens, "write_s": write_s, "eos_id": manifest["tokens"]["tokenizer"]["eos_id"],
            "num_documents": sum(manifest["shards"]["num_samples"])}


def peers_python() -> Path | None:
    """The peers' venv with litdata, datasets and tokenizers; None (and why, printed) when it cannot be built."""
    from benchmarks.peers_env import peers_python as build

    try:
        python = build()
        probe = subprocess.run([str(python), "-c", "import litdata, datasets, tokenizers, megatron.core"],
                               capture_output=True)
        if probe.returncode:
            subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_EXTRAS], check=True)
        return python
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"peers' venv unavailable: {exc}", flush=True)
        return None


def child(python: Path | str, spec: dict[str, Any], timeout_s: float = 900) -> dict[str, Any]:
    """Run one configuration in a fresh process; its JSON line, or {"error": ...}."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run([str(python), "-m", "benchmarks.token_peers", json.dumps(spec)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode or not lines:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
    return json.loads(lines[-1])


def configs(data: dict[str, Any], args: argparse.Namespace, formats: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    facts = {"vocab_size": args.vocab, "eos_id": data["eos_id"], "num_tokens": data["num_tokens"]}
    for L in (2048, 8192):
        common = {"seq_len": L, "batch_size": args.batch_size, "batches": args.batches}
        for workers in (0, 2):
            for ids_only in (True, False):
                out.append({"loader": "shardify", "url": data["url"], "num_workers": workers, "ids_only": ids_only,
                            **common})
            for name, path in formats.items():
                out.append({"loader": name, name: path, "num_workers": workers, **facts, **common})
        out.append({"loader": "memmap", "bin": data["bin"], "num_workers": 0, **common})
    return out


def label(spec: dict[str, Any]) -> str:
    if spec["loader"] == "shardify":
        return f"shardify, {'input_ids only' if spec['ids_only'] else 'ids + positions + doc ids'}"
    return {"memmap": "np.memmap get_batch (nanoGPT; random windows, not exactly once)",
            "litdata": "LitData StreamingDataset + TokensLoader",
            "megatron": "Megatron-Core GPTDataset (+ position ids)"}[spec["loader"]]


def run(args: argparse.Namespace) -> str:
    load_start = os.getloadavg()
    work = Path(args.work)
    data = prepare(work, args.copies, args.vocab)
    print(f"corpus: {data['num_documents']} documents, {data['num_tokens']} tokens; write {data['write_s']:.1f} s",
          flush=True)
    peers = None if args.no_peers else peers_python()
    formats: dict[str, str] = {}
    notes: list[str] = []
    if peers is not None:
        for name in ("litdata", "megatron"):
            path = str(work / name)
            made = child(peers, {"task": f"write_{name}", "shards": data["shards"], name: path})
            if "error" in made:
                notes.append(f"{name}: its dataset could not be written: {made['error']}")
            else:
                formats[name] = path
    specs = configs(data, args, formats)
    runs: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(specs))}
    for r in range(args.rounds):
        for i, spec in enumerate(specs):
            python = peers if spec["loader"] in ("litdata", "megatron") else sys.executable
            result = child(python, spec)
            result["load"] = os.getloadavg()[0]
            runs[i].append(result)
            print(f"round {r}: L={spec['seq_len']} w={spec['num_workers']} {label(spec)}: {result}", flush=True)
    tokenize = child(peers, {"task": "datasets_map", "jsonl": data["jsonl"], "tokenizer": data["tokenizer"],
                             "eos_id": data["eos_id"], "cache": str(work / "hf-cache")}) if peers else None
    return report(specs, runs, data, tokenize, notes, load_start, args)


def median(results: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in results if key in r]
    return statistics.median(values) if values else None


def report(specs: list[dict[str, Any]], runs: dict[int, list[dict[str, Any]]], data: dict[str, Any],
           tokenize: dict[str, Any] | None, notes: list[str], load_start: tuple[float, ...],
           args: argparse.Namespace) -> str:
    rows = ["| seq_len | workers | loader | tokens/s, median | runs (M tokens/s) | first batch (s) | load |",
            "|---:|---:|---|---:|---|---:|---:|"]
    rates: dict[tuple[int, int, str], float] = {}
    for i, spec in enumerate(specs):
        rate = median(runs[i], "tokens_per_s")
        rates[spec["seq_len"], spec["num_workers"], label(spec)] = rate or 0.0
        cells = ", ".join(f"{r['tokens_per_s'] / 1e6:.1f}" if "tokens_per_s" in r else "error" for r in runs[i])
        first = median(runs[i], "first_batch_s")
        rows.append(f"| {spec['seq_len']} | {spec['num_workers']} | {label(spec)} | "
                    f"{f'{rate / 1e6:.1f} M' if rate else 'failed'} | {cells} | "
                    f"{f'{first:.2f}' if first is not None else '-'} | {median(runs[i], 'load') or 0:.1f} |")
    errors = [f"- {label(s)} (L={s['seq_len']}, w={s['num_workers']}): {r['error']}"
              for i, s in enumerate(specs) for r in runs[i][:1] if "error" in r]
    targets = target_rows(rates)
    write_rate = data["num_tokens"] / data["write_s"]
    tok_rows = [f"| `shardify write --workers 2` (tokenize + write shards, checksums, manifest) | "
                f"{write_rate / 1e6:.2f} M tokens/s | {data['write_s']:.1f} s |"]
    if tokenize and "tokens_per_s" in tokenize:
        tok_rows.append(f"| `datasets.map` (batched, num_proc=2; tokenize only, Arrow cache) | "
                        f"{tokenize['tokens_per_s'] / 1e6:.2f} M tokens/s | {tokenize['seconds']:.1f} s |")
    elif tokenize:
        notes.append(f"datasets.map failed: {tokenize.get('error')}")
    return "\n".join([
        "# Token loading (issue 21)", "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: `python -m benchmarks.bench_tokens --copies "
        f"{args.copies} --batches {args.batches} --rounds {args.rounds}`; the bundled corpus (pydoc_data topics + "
        f"stdlib docstrings) {args.copies} times over: {data['num_documents']} documents, {data['num_tokens']:,} "
        f"tokens (BPE of {args.vocab} ids, uint16), tokenized once. Batch {args.batch_size} sequences; tokens/s "
        f"counts input tokens (batch x seq_len) over {args.batches} batches after the first; each configuration a "
        "fresh process, rounds interleaved, medians.", "",
        f"{machine_markdown()} Load average at the start: {', '.join(f'{x:.1f}' for x in load_start)} on 2 cores "
        "shared with other engineers' test runs (the load column: at the end of each configuration's runs); "
        "ratios within one run are what to read, single numbers move with the load.", "",
        *rows, "", *targets, "",
        "| tokenization | rate | time |", "|---|---:|---:|", *tok_rows, "",
        *(["Notes:", *[f"- {n}" for n in notes], *errors, ""] if notes or errors else []),
    ]) + "\n"


def target_rows(rates: dict[tuple[int, int, str], float]) -> list[str]:
    """Issue 21's targets at 2 workers: >= 2x the best exactly-once peer, >= 0.8x np.memmap get_batch."""
    out = ["| target (2 workers) | seq_len | measured | met |", "|---|---:|---|---|"]
    ids = label({"loader": "shardify", "ids_only": True})
    full = label({"loader": "shardify", "ids_only": False})
    memmap = label({"loader": "memmap"})
    peers = [label({"loader": name}) for name in ("litdata", "megatron")]
    for L in (2048, 8192):
        ours, mm = rates.get((L, 2, ids), 0.0), rates.get((L, 0, memmap), 0.0)
        best, peer = max((rates.get((L, 2, p), 0.0), p) for p in peers)
        if best:
            out.append(f"| >= 2x the best exactly-once peer ({peer.split(' ')[0]}) | {L} | {ours / best:.2f}x | "
                       f"{'yes' if ours >= 2 * best else 'no'} |")
        if mm:
            out.append(f"| >= 0.8x np.memmap get_batch, input_ids only | {L} | {ours / mm:.2f}x | "
                       f"{'yes' if ours >= 0.8 * mm else 'no'} |")
            out.append(f"| (with positions and doc ids) | {L} | {rates.get((L, 2, full), 0.0) / mm:.2f}x | - |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=30, help="copies of the bundled corpus (default %(default)s)")
    parser.add_argument("--vocab", type=int, default=8192, help="BPE vocabulary (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=60, help="batches timed per run (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true",
                        help="skip LitData, Megatron-Core and datasets (no peers' venv)")
    parser.add_argument("--work", default=str(ROOT / "out" / "bench_tokens"))
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results_tokens.md"))
    args = parser.parse_args(argv)
    text = run(args)
    Path(args.results).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
