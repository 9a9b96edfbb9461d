"""The main job end to end on the embedded default: scikit-learn's digits, shardified, inspected, trained.

Run by `make demo` (which sets up .venv first). Every step is the command a user would type, so
the demo doubles as a check that the commands in README.md work.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from tools.demo_steps import _bin, _run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="out/demo", help="working directory (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=4, help="training epochs (default: %(default)s)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks for torchrun (default: %(default)s)")
    parser.add_argument("--no-train", action="store_true", help="stop after shardify inspect")
    parser.add_argument("--text", action="store_true",
                        help="the text demo instead: tokenize the bundled Python docs, train a tiny GPT (tools/demo_text.py)")
    parser.add_argument("--quick", action="store_true", help="with --text: a smaller run (<= 30 s) that the tests use")
    args = parser.parse_args(argv)
    if args.text:
        from tools.demo_text import main as text_demo

        return text_demo(Path(args.out if args.out != "out/demo" else "out/demo-text"), quick=args.quick,
                         nproc=args.nproc)

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    images, shards = out / "digits", out / "shards"
    py = sys.executable
    _run("export scikit-learn's digits as PNG folders", [py, "-m", "tools.export_digits", str(images)])
    for split in ("train", "val"):
        for fmt in ("tar", "parquet"):
            _run(
                f"shardify {split} -> {fmt}",
                [_bin("shardify"), "write", str(images / split), str(shards / f"{split}-{fmt}"),
                 "--format", fmt, "--shuffle", "--seed", "0", "--max-samples-per-shard", "200", "--quiet"],
            )
    for fmt in ("tar", "parquet"):
        _run(f"shardify inspect train-{fmt}", [_bin("shardify"), "inspect", str(shards / f"train-{fmt}")])
    _run("shardify verify train-tar", [_bin("shardify"), "verify", str(shards / "train-tar")])
    if args.no_train or not (Path(__file__).resolve().parents[1] / "trainer" / "__main__.py").exists():
        print("\ndemo: shards written and verified under", shards)
        return 0
    run_dir = out / "run"
    _run(
        f"train on {args.nproc} ranks with torchrun (gloo, CPU)",
        [py, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
         "-m", "trainer", "--data", str(shards / "train-tar"), "--val-data", str(shards / "val-tar"),
         # 32x32 digits: no random crop (it would cut the digit), small batches, short warmup.
         "--model", "resnet", "--image-size", "32", "--no-augment", "--batch-size", "16", "--lr", "0.05",
         "--warmup-steps", "10", "--num-workers", "1", "--epochs", str(args.epochs), "--out", str(run_dir)],
    )
    print(f"\ndemo: done. Shards in {shards}, run outputs (metrics, trace, chart) in {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
