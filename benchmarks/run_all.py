"""Run every benchmark in turn, then gather their result files into benchmarks/README.md.

    python -m benchmarks.run_all [--only loader,first,s3,write,decode,plan,dali,tokens] [--quick]
    python -m benchmarks.run_all --gather-only     # regenerate benchmarks/README.md, run nothing
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from benchmarks.headline import HEADER, HEADLINES, RATIO_NOTE, date_of, headline_row, machine_of, title_of

HERE = Path(__file__).resolve().parent
ORDER = ("plan", "decode", "write", "loader", "first", "s3", "mix", "scale", "tokens")
# Names whose command is not benchmarks.bench_NAME.
COMMANDS = {"mix": ["benchmarks.bench_loader", "--mix"]}
QUICK = {"loader": ["--num-images", "2000", "--repeats", "1", "--epochs", "2"],
         "first": ["--num-images", "2000", "--repeats", "1"], "s3": ["--num-images", "2000", "--repeats", "1"],
         "mix": ["--num-images", "2000", "--repeats", "1", "--epochs", "2"],
         "tokens": ["--copies", "4", "--batches", "10", "--rounds", "1"]}


def gather() -> None:
    """benchmarks/README.md = the intro, one headline table (each task's newest run: shardify against
    its best peer), then a link to every results file for the detail; nothing pasted together."""
    intro = (HERE / "README.intro.md").read_text().strip() if (HERE / "README.intro.md").exists() else "# Benchmarks"
    rows = [h for name, read in HEADLINES.items() if (HERE / f"results_{name}.md").exists()
            for h in read(HERE / f"results_{name}.md")]
    table = list(HEADER)
    table += [headline_row(h) for h in rows]
    links = [f"- [{title_of(f.read_text())}]({f.name}): {machine_of(f.read_text())}, {date_of(f)}"
             for f in _detail_files()]
    page = [intro, "## Headline: shardify against the best peer", *RATIO_NOTE, "\n".join(table),
            "## The detail, one file per benchmark", "\n".join(links)]
    (HERE / "README.md").write_text("\n\n".join(page) + "\n")


def _detail_files() -> list[Path]:
    names = [f"results_{n}.md" for n in (*ORDER, "verify", "dali", "faults")] + ["dali_gpu_note.md"]
    names += sorted(p.name for p in HERE.glob("results_*.md") if p.name not in names)
    return [HERE / n for n in names if (HERE / n).exists()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(ORDER))
    parser.add_argument("--quick", action="store_true", help="smaller data, one repeat")
    parser.add_argument("--gather-only", action="store_true",
                        help="run no benchmark: only regenerate benchmarks/README.md from the results files")
    args = parser.parse_args(argv)
    if args.gather_only:
        gather()
        return 0
    failed = []
    for name in args.only.split(","):
        module = COMMANDS.get(name, [f"benchmarks.bench_{name}"])
        cmd = [sys.executable, "-m", *module, *(QUICK.get(name, []) if args.quick else [])]
        print(f"\n=== {' '.join(cmd)}", flush=True)
        if subprocess.run(cmd, cwd=HERE.parent, check=False).returncode != 0:
            failed.append(name)
    gather()
    if failed:
        print(f"benchmarks that failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
