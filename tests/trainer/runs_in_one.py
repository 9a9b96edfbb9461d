"""Several `python -m trainer` runs, and shell commands between them, in one interpreter: for runs that
must share what a test's own process cannot give them (test_checkpoint_faults.py: a private mount
namespace), at the cost of one interpreter's imports (~5 CPU-s each) instead of one per run.

usage: python -m tests.trainer.runs_in_one STEPS.json
STEPS is a JSON list, run in order, of
  ["trainer", PREFIX, [ARGS...]]   the trainer's main(ARGS): stdout, stderr and the exit code in
                                   PREFIX.out, PREFIX.err and PREFIX.rc
  ["sh", COMMAND, MUST_SUCCEED]    a shell command; if MUST_SUCCEED and it fails, stop with exit 90 + its index
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path


def run(steps: list[list]) -> int:
    from trainer.__main__ import main as trainer_main

    for i, step in enumerate(steps):
        if step[0] == "sh":
            _, command, must_succeed = step
            if subprocess.run(command, shell=True, check=False).returncode != 0 and must_succeed:
                return 90 + i
            continue
        _, prefix, args = step
        with open(f"{prefix}.out", "w") as out, open(f"{prefix}.err", "w") as err, \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = trainer_main(list(args))
            except SystemExit as exc:  # argparse's own exits
                code = exc.code if isinstance(exc.code, int) else 1
        Path(f"{prefix}.rc").write_text(f"{code}\n")
    return 0


if __name__ == "__main__":
    code = run(json.loads(Path(sys.argv[1]).read_text()))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as trainer/__main__.py: no interpreter finalization with torch's threads about
