"""Run the trainer as users do (torchrun with gloo, or python -m trainer) in a subprocess, never leaving it behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.process_tree import kill_tree

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def trainer_cmd(args: list[str], *, nproc: int | None, max_restarts: int = 0) -> list[str]:
    """`torchrun --standalone --nproc_per_node=N -m trainer ARGS`, or `python -m trainer ARGS` when nproc is None."""
    if nproc is None:
        return [sys.executable, "-m", "trainer", *args]
    return [TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", f"--max-restarts={max_restarts}",
            "--monitor-interval=0.2", "-m", "trainer", *args]


def env_for(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def start(args: list[str], *, nproc: int | None = 2, env: dict[str, str] | None = None,
          max_restarts: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen(trainer_cmd(args, nproc=nproc, max_restarts=max_restarts), cwd=REPO,
                            env=env_for(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen[str], *, timeout_s: float) -> Result:
    """Wait for the run; on timeout kill its whole process group (torchrun and every rank) and fail."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        raise AssertionError(f"trainer did not finish in {timeout_s} s\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}")
    finally:
        kill_group(proc)
    return Result(proc.returncode, out, err)


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL everything left of the run (torchrun, ranks in their own sessions, loader workers)."""
    kill_tree(proc.pid)
    if proc.poll() is None:
        proc.wait(timeout=10)


def run_trainer(args: list[str], *, nproc: int | None = 2, env: dict[str, str] | None = None,
                timeout_s: float = 90, max_restarts: int = 0) -> Result:
    return finish(start(args, nproc=nproc, env=env, max_restarts=max_restarts), timeout_s=timeout_s)


def run_here(args: list[str], capsys: Any) -> Result:
    """The trainer in this interpreter: one process, no torchrun (the subject is not the ranks). Torch and
    the trainer are imported here already; a new interpreter costs ~5 CPU-seconds of imports (torch, and
    torch._dynamo at the first optimizer step) on this machine, more than a test's training."""
    from trainer.__main__ import main

    capsys.readouterr()
    code = main([*args, "--no-live"])
    out = capsys.readouterr()
    return Result(code, out.out, out.err)


def run_study(argv: list[str], env: dict[str, str], capsys: Any, monkeypatch: Any) -> tuple[int, str]:
    """`python -m trainer.scaling ARGV` in this interpreter (its torchrun jobs are processes of their own,
    with `env`): the study's own process would import torch and the trainer again for nothing."""
    from trainer.scaling.study import main

    for name, value in env_for(env).items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out + out.err


def ok(result: Result) -> Result:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
    return result


def summary(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())


def committed_keys(out: Path) -> dict[int, list[str]]:
    """step -> keys of every rank's committed steps (the key files are truncated on resume)."""
    steps: dict[int, list[str]] = {}
    for path in sorted(out.glob("keys-rank*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            steps.setdefault(rec["step"], []).extend(rec["keys"])
    return steps


SHARDS = [60, 45, 75]  # 180 real images in uneven shards


def resumable_args(data: str, out: Path, *extra: str) -> list[str]:
    """The flags of the shared run (a sleeping model, 1 loader worker, --record-keys) and `extra`."""
    return ["--data", data, "--num-classes", "10", "--model", "tests.trainer.fakes:sleepy", "--batch-size", "4",
            "--image-size", "8", "--num-workers", "1", "--log-every", "5", "--out", str(out), "--record-keys",
            "--dist-timeout-s", "60", *extra]


class FiveSteps:
    """The dataset, and a 2-rank run's first 5 steps of it (--max-steps 5 --epochs 1) with its checkpoint."""

    def __init__(self, data: str, out: Path) -> None:
        self.data, self._out = data, out

    def copy_to(self, out: Path) -> Path:
        """The run's --out (checkpoints, keys, metrics), copied for one test to resume and append to."""
        shutil.copytree(self._out, out)
        return out
