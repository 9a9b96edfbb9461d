"""The text demo (`python -m tools.demo --text`): the Python documentation that ships with CPython,
tokenized once by a BPE trained on it, packed into sequences, a tiny GPT trained on 2 ranks on CPU.

Every step is the command a user would type. The loss of the first report and of the last are
printed, and the demo fails unless it fell. `--quick` (<= 30 s) is the variant the tests run.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from tools.demo_steps import _bin, _run
from tools.text_corpus import documents, write_jsonl

# (vocabulary, trainer flags): the full demo trains for a couple of minutes on 2 CPU ranks.
FULL = (2000, ["--seq-len", "128", "--n-layer", "3", "--n-embd", "96", "--n-head", "4", "--batch-size", "8",
               "--lr", "3e-3", "--max-steps", "250", "--log-every", "10", "--warmup-steps", "20"])
QUICK = (512, ["--seq-len", "32", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8",
               "--lr", "5e-3", "--max-steps", "40", "--log-every", "2", "--warmup-steps", "4"])


def write_corpus(text: Path) -> tuple[Path, Path]:
    """The bundled corpus as JSON Lines: every tenth document held out for validation."""
    text.mkdir(parents=True, exist_ok=True)
    docs = documents()
    train = write_jsonl(text / "train.jsonl", [d for i, d in enumerate(docs) if i % 10])
    val = write_jsonl(text / "val.jsonl", [d for i, d in enumerate(docs) if i % 10 == 0])
    print(f"corpus: {len(docs)} documents (pydoc_data topics and stdlib docstrings) in {text}", flush=True)
    return train, val


def losses(metrics: Path) -> list[float]:
    """The mean training loss of every report interval in metrics.jsonl, in order."""
    with open(metrics, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    return [float(r["loss"]) for r in lines if r.get("kind") == "train"]


def main(out: Path, *, quick: bool, nproc: int = 2) -> int:
    if out.exists():
        shutil.rmtree(out)
    vocab, flags = QUICK if quick else FULL
    train, val = write_corpus(out / "text")
    tok, shards = out / "tokenizer.json", out / "tokens"
    shardify = _bin("shardify")
    _run("train a BPE tokenizer on the corpus", [shardify, "tokenizer", "train", str(train), "--vocab-size",
                                                 str(vocab), "-o", str(tok)])
    for split, src in (("train", train), ("val", val)):
        _run(f"shardify write {split} -> token shards", [shardify, "write", str(src), str(shards / split),
                                                         "--tokenizer", str(tok), "--tokens-per-shard", "40000",
                                                         "--quiet"])
    _run("shardify inspect train", [shardify, "inspect", str(shards / "train")])
    run_dir = out / "run"
    _run(f"train a tiny GPT on {nproc} ranks with torchrun (gloo, CPU)",
         [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
          "-m", "trainer", "--model", "gpt", "--data", str(shards / "train"), "--val-data", str(shards / "val"),
          "--tokenizer", str(tok), "--optimizer", "adamw", "--weight-decay", "0.01", "--num-workers", "1",
          "--num-threads", "1", "--no-live", "--out", str(run_dir), *flags])
    seen = losses(run_dir / "metrics.jsonl")  # each report's loss is one step's: the end is averaged
    end = sum(seen[-3:]) / max(1, len(seen[-3:]))
    if len(seen) < 4 or not end < seen[0]:
        sys.exit(f"demo: the loss did not fall ({seen}); see {run_dir}/metrics.jsonl")
    print(f"\ndemo: the loss fell from {seen[0]:.3f} (first report) to {end:.3f} (mean of the last three reports). "
          f"Token shards in {shards}, run outputs (metrics, trace, chart) in {run_dir}")
    return 0
