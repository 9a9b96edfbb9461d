"""`make demo-pairs`: a pair dataset drawn locally (shapes with captions saying what is drawn), a
tokenizer trained on its captions, and a small CLIP trained on 2 CPU ranks (torchrun, gloo),
validated zero-shot on held-out labelled images of the 9 colour-shape classes (chance: 1/9).

    python -m tools.demo_pairs [--root runs/pairs] [--pairs 3000] [--epochs 6]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from tools.pair_data import CLASSES, pair, write_labelled_images, write_pair_folder


def prepare(root: Path, num_pairs: int) -> tuple[Path, Path, Path]:
    """(train pair dataset, validation image dataset, tokenizer.json) under root, made once."""
    from sharding.cli import main as shardify
    from sharding.write.tokenizer import train_bpe

    train, val, tok = root / "train", root / "val", root / "tokenizer.json"
    if not (train / "manifest.json").exists():
        src = write_pair_folder(root / "src-pairs", num_pairs)
        assert shardify(["write", str(src), str(train), "--captions", "--quiet", "--overwrite"]) == 0
    if not (val / "manifest.json").exists():
        src = write_labelled_images(root / "src-val", 30)
        assert shardify(["write", str(src), str(val), "--quiet", "--overwrite"]) == 0
    if not tok.exists():
        texts = [c for i in range(500) for c in pair(i)[1]] + [f"a photo of a {n}" for n in CLASSES]
        train_bpe(texts, 400, str(tok))
    return train, val, tok


def train_args(root: Path, *, epochs: int, batch_size: int = 64) -> list[str]:
    train, val, tok = root / "train", root / "val", root / "tokenizer.json"
    return ["--data", str(train), "--val-data", str(val), "--model", "clip", "--tokenizer", str(tok),
            "--context-length", "16", "--image-size", "32", "--epochs", str(epochs), "--batch-size", str(batch_size),
            "--lr", "0.003", "--optimizer", "adamw", "--weight-decay", "0.0", "--warmup-steps", "5",
            "--no-augment", "--num-workers", "1", "--device", "cpu", "--out", str(root / "run"),
            "--checkpoint-dir", str(root / "run" / "checkpoints")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=Path("runs/pairs"))
    p.add_argument("--pairs", type=int, default=3000)
    p.add_argument("--epochs", type=int, default=6)
    args = p.parse_args(argv)
    prepare(args.root, args.pairs)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    cmd = [torchrun, "--standalone", "--nproc_per_node=2", "-m", "trainer", *train_args(args.root, epochs=args.epochs)]
    code = subprocess.call(cmd)
    summary = args.root / "run" / "summary.json"
    if code == 0 and summary.exists():
        val = json.loads(summary.read_text()).get("validation") or {}
        print(f"zero-shot accuracy {val.get('accuracy', float('nan')):.1%} on {val.get('samples')} held-out "
              f"images of {len(CLASSES)} classes (chance {1 / len(CLASSES):.1%})")
    return code


if __name__ == "__main__":
    sys.exit(main())
