"""`python -m tests.sharding.blocked_writer GO ARGS...`: `shardify ARGS` whose write waits, after taking
the destination's lease and starting its journal, until the file GO exists: a writer caught mid-write
for the lease tests (another command started beside it, then kill -9 or Ctrl-C)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _ctrl_c_reaches_it() -> None:
    """SIGINT at its default in the child (a shell's background job inherits it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(go: Path, *args: object) -> subprocess.Popen:
    """The blocked writer as a child process (its own session, so signals reach it alone)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "tests.sharding.blocked_writer", str(go), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                            start_new_session=True, preexec_fn=_ctrl_c_reaches_it)


def wait_until(proc: subprocess.Popen, ready: Any, timeout_s: float = 60) -> None:
    """Poll `ready()` until true; fail with the writer's output if it ends first."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"the writer ended before it was caught mid-write: {proc.communicate()}")
        assert time.monotonic() < deadline, "the writer never reached its write"
        time.sleep(0.05)


def main() -> int:
    import sharding.write.writer as writer
    from sharding.cli import main as cli

    go, real = Path(sys.argv[1]), writer._run

    def waiting(*args: Any, **kwargs: Any) -> Any:
        while not go.exists():
            time.sleep(0.02)
        return real(*args, **kwargs)

    writer._run = waiting  # type: ignore[assignment]
    return cli(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
