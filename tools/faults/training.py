"""The trainer under faults: a truncated newest checkpoint under `--resume auto`, and kill -9 then
SIGSTOP of a rank in one job under `torchrun --max-restarts` (committed steps exactly once)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tools.faults.common import Row, Size, env, make_image_folder, shardify
from tools.process_tree import kill_tree


def _trainer_here(argv: list[str]) -> tuple[int, str]:
    """`python -m trainer ARGV` in this process (its imports are paid already): exit code and stderr."""
    from trainer.__main__ import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main([*argv, "--no-live"])
    return code, err.getvalue()


def checkpoint_scenarios(workdir: Path) -> list[Row]:
    """A truncated newest checkpoint: --resume auto falls back to the previous complete one and says so.
    The two runs are one process each, in this one: the subject is the trainer's resume, not its ranks."""
    out = workdir / "train"
    base = ["--data", "synthetic:?samples=64&classes=4", "--model", "mlp", "--batch-size", "8", "--image-size",
            "8", "--checkpoint-every", "1", "--keep-checkpoints", "3", "--out", str(out), "--device", "cpu"]
    code, err = _trainer_here([*base, "--max-steps", "2"])
    ckpts = sorted((out / "checkpoints").glob("ckpt-*.pt"))
    if code != 0 or not ckpts:
        return [Row(group="checkpoint", scenario="truncated newest checkpoint", figure="setup failed",
                    passed=False, note=err.strip()[-300:])]
    newest = ckpts[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    start = time.perf_counter()
    code, err = _trainer_here([*base, "--max-steps", "3"])
    seconds = time.perf_counter() - start
    notes = (out / "metrics.jsonl").read_text() if (out / "metrics.jsonl").exists() else ""
    skipped = f"skipped checkpoint {newest.name}" in notes
    ok = code == 0 and skipped
    return [Row(group="checkpoint", scenario="truncated newest checkpoint, --resume auto",
                figure=f"exit {code}, fell back past {newest.name}: {'yes' if skipped else 'no'} "
                       f"({seconds:.1f} s)", passed=ok, note="" if ok else err.strip()[-300:])]


def _committed_once(out: Path) -> tuple[bool, int]:
    """(every committed step present once and no sample key twice, number of committed steps)."""
    steps: dict[int, list[str]] = {}
    for path in sorted(out.glob("keys-rank*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            steps.setdefault(rec["step"], []).extend(rec["keys"])
    if not steps:
        return False, 0
    keys = [k for ks in steps.values() for k in ks]
    epochs_keys: dict[str, int] = {}
    for k in keys:
        epochs_keys[k] = epochs_keys.get(k, 0) + 1
    contiguous = sorted(steps) == list(range(1, max(steps) + 1))
    # Every sample comes once per epoch: no key more often than any other by more than one epoch.
    counts = sorted(epochs_keys.values())
    return contiguous and counts[-1] - counts[0] <= 1, len(steps)


def _resumes(out: Path) -> int:
    """How many times a restarted group resumed from a checkpoint the 2 ranks saved (its note in
    metrics.jsonl), rather than training from step 0 again."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return 0
    notes = [json.loads(line).get("text", "") for line in path.read_text().splitlines() if line.strip()]
    return sum(n.startswith("resumed from ") and "(saved by 2 ranks, now 2)" in n for n in notes)


def rank_pid(root_pid: int, rank: int) -> int | None:
    """The pid of the trainer process of `rank` among the descendants of `root_pid` (torchrun), or None."""
    import psutil

    for proc in psutil.Process(root_pid).children(recursive=True):
        try:
            if proc.environ().get("RANK") == str(rank) and "trainer" in " ".join(proc.cmdline()):
                return proc.pid
        except psutil.Error:
            continue
    return None


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _wait(proc: subprocess.Popen, until: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `until` while the job runs; whether it came true."""
    began = time.monotonic()
    while proc.poll() is None and time.monotonic() - began < timeout_s:
        if until():
            return True
        time.sleep(0.1)
    return False


def trainer_rank_scenarios(workdir: Path, size: Size, seed: int) -> list[Row]:
    """kill -9 of rank 1 mid-epoch, then SIGSTOP of rank 1 of the restarted group, in one job under torchrun
    --max-restarts=2: each restarted group resumes from the ranks' checkpoint, the committed steps come
    exactly once, and how long until each fault is detected (SIGSTOP: the rank named) and the job is done."""
    images = workdir / "images"
    if not images.exists():
        make_image_folder(images, size.images, seed=seed)
    data = workdir / "rank-ds"
    if not (data / "manifest.json").exists():
        shardify(["write", str(images), str(data), "--max-samples-per-shard", "8", "--quiet"])
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    epochs, out = max(3, 240 // size.images), workdir / "rank-faults"
    cmd = [torchrun, "--standalone", "--nproc_per_node=2", "--max-restarts=2", "--monitor-interval=0.2",
           "-m", "trainer", "--data", str(data), "--num-classes", "3", "--model", "mlp", "--batch-size", "2",
           "--image-size", "8", "--num-workers", "0", "--record-keys", "--checkpoint-every", "2",
           "--dist-timeout-s", "15", "--epochs", str(epochs), "--out", str(out), "--no-live", "--device", "cpu"]
    err_path, keys0 = workdir / "rank-faults.err", out / "keys-rank0.jsonl"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env={**env(), "OMP_NUM_THREADS": "1"},
                                start_new_session=True)
    faults: list[dict] = []  # per signal: what happened after it
    try:
        for name, sig in (("kill -9", signal.SIGKILL), ("SIGSTOP", signal.SIGSTOP)):
            # Mid-epoch: the group (the first, or the one restarted after the kill) has trained 3 more steps.
            if faults:  # the kill: torchrun restarts the group, which resumes (its note) with a new rank 1
                killed = faults[-1]["pid"]
                if _wait(proc, lambda: _resumes(out) >= 1 and rank_pid(proc.pid, 1) not in (None, killed), 180):
                    faults[-1]["restart_s"] = time.monotonic() - faults[-1]["hit"]
            base = _lines(keys0)
            pid = rank_pid(proc.pid, 1) if _wait(proc, lambda: _lines(keys0) >= base + 3, 180) else None
            if pid is None or proc.poll() is not None:
                faults.append({"name": name, "pid": None})
                break
            seen = len(err_path.read_text())  # the naming must come after this signal
            os.kill(pid, sig)
            faults.append({"name": name, "sig": sig, "pid": pid, "hit": time.monotonic(), "seen": seen,
                           "detected_s": None, "resumes": _resumes(out)})
        injected = len(faults) == 2 and all(f["pid"] for f in faults)  # else no waiting for the end
        stop = faults[-1]
        while injected and proc.poll() is None and time.monotonic() - stop["hit"] < 300:
            if stop["detected_s"] is None and "stopped responding" in err_path.read_text()[stop["seen"]:]:
                stop["detected_s"] = time.monotonic() - stop["hit"]
            time.sleep(0.2)
        end = time.monotonic()
        code = proc.poll()
    finally:
        kill_tree(proc.pid)  # ranks run in sessions of their own
        proc.wait(timeout=30)
    once, num_steps = _committed_once(out)
    resumes = _resumes(out)
    expected_steps = epochs * (size.images // (2 * 2))  # 2 ranks x batch 2, the tail dropped
    tail = err_path.read_text()[-300:].replace("\n", " ")
    faults += [{"name": name, "pid": None} for name in ("kill -9", "SIGSTOP")[len(faults):]]
    rows = []
    for i, f in enumerate(faults):
        scenario = (f"{f['name']} of rank 1 mid-epoch" + (" (of the restarted group)" if i else "")
                    + ", --max-restarts 2")
        if f["pid"] is None:
            rows.append(Row(group="trainer", scenario=scenario, figure="rank 1 not found mid-run (or not reached)",
                            passed=False, note=tail))
            continue
        stopped = f["sig"] == signal.SIGSTOP
        # This fault's group restarted and resumed: one more resume note than before it.
        resumed = resumes >= f["resumes"] + 1
        if stopped:
            detect = (f"rank 1 named after {f['detected_s']:.1f} s (--dist-timeout-s 15)"
                      if f["detected_s"] is not None else "rank not named")
        else:
            detect = "torchrun saw the exit" + (f", group resumed {f['restart_s']:.0f} s after the signal"
                                                if "restart_s" in f else "")
        ok = (code == 0 and once and num_steps == expected_steps and resumed and injected
              and (not stopped or f["detected_s"] is not None))
        rows.append(Row(group="trainer", scenario=scenario,
                        figure=f"{detect}; job done {end - f['hit']:.0f} s after the signal, exit {code}; restarted "
                               f"group resumed from a checkpoint: {'yes' if resumed else 'NO'}; {num_steps} of "
                               f"{expected_steps} steps committed, exactly once: {'yes' if once else 'NO'}",
                        passed=ok, note="" if ok else tail))
    return rows
