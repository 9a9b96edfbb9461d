"""Run every benchmark in turn, then gather their result files into benchmarks/README.md.

    python -m benchmarks.run_all [--only loader,first,s3,write,decode,plan,dali] [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ("plan", "decode", "write", "loader", "first", "s3", "mix", "scale")
# Names whose command is not benchmarks.bench_NAME.
COMMANDS = {"mix": ["benchmarks.bench_loader", "--mix"]}
QUICK = {"loader": ["--num-images", "2000", "--repeats", "1", "--epochs", "2"],
         "first": ["--num-images", "2000", "--repeats", "1"], "s3": ["--num-images", "2000", "--repeats", "1"],
         "mix": ["--num-images", "2000", "--repeats", "1", "--epochs", "2"]}


def gather() -> None:
    """benchmarks/README.md = an intro plus every results_*.md, in a fixed order."""
    parts = [(HERE / "README.intro.md").read_text()] if (HERE / "README.intro.md").exists() else []
    for name in (*ORDER, "dali"):
        f = HERE / f"results_{name}.md"
        if f.exists():
            parts.append(_demoted(f.read_text()))
    note = HERE / "dali_gpu_note.md"
    if note.exists():
        parts.append(_demoted(note.read_text()))
    (HERE / "README.md").write_text("\n\n".join(p.strip() for p in parts) + "\n")


def _demoted(text: str) -> str:
    """Every heading one level down: a results file's title becomes a section of this page, its
    sections subsections (hand-written readings live in the results files, so nothing is lost)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        out.append("#" + line if line.startswith("#") and not fenced else line)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(ORDER))
    parser.add_argument("--quick", action="store_true", help="smaller data, one repeat")
    args = parser.parse_args(argv)
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
