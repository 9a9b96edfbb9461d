"""The trainer under faults: a truncated newest checkpoint under `--resume auto`, and kill -9 or
SIGSTOP of a rank under `torchrun --max-restarts` (committed steps exactly once)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tools.faults.common import Row, Size, env, make_image_folder, shardify
from tools.process_tree import kill_tree


def checkpoint_scenarios(workdir: Path) -> list[Row]:
    """A truncated newest checkpoint: --resume auto falls back to the previous complete one and says so."""
    out = workdir / "train"
    base = [sys.executable, "-m", "trainer", "--data", "synthetic:?samples=64&classes=4", "--model", "mlp",
            "--batch-size", "8", "--image-size", "8", "--checkpoint-every", "1", "--keep-checkpoints", "3",
            "--out", str(out), "--no-live", "--device", "cpu"]
    first = subprocess.run([*base, "--max-steps", "2"], capture_output=True, text=True, timeout=300, env=env())
    ckpts = sorted((out / "checkpoints").glob("ckpt-*.pt"))
    if first.returncode != 0 or not ckpts:
        return [Row(group="checkpoint", scenario="truncated newest checkpoint", figure="setup failed",
                    passed=False, note=first.stderr.strip()[-300:])]
    newest = ckpts[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    start = time.perf_counter()
    second = subprocess.run([*base, "--max-steps", "3"], capture_output=True, text=True, timeout=300, env=env())
    seconds = time.perf_counter() - start
    notes = (out / "metrics.jsonl").read_text() if (out / "metrics.jsonl").exists() else ""
    skipped = f"skipped checkpoint {newest.name}" in notes
    ok = second.returncode == 0 and skipped
    return [Row(group="checkpoint", scenario="truncated newest checkpoint, --resume auto",
                figure=f"exit {second.returncode}, fell back past {newest.name}: {'yes' if skipped else 'no'} "
                       f"({seconds:.1f} s)", passed=ok, note="" if ok else second.stderr.strip()[-300:])]


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


def _resumed_from_a_checkpoint(out: Path) -> bool:
    """Whether the restarted group resumed from a checkpoint the 2 ranks saved (its note in metrics.jsonl),
    rather than training from step 0 again."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return False
    notes = [json.loads(line).get("text", "") for line in path.read_text().splitlines() if line.strip()]
    return any(n.startswith("resumed from ") and "(saved by 2 ranks, now 2)" in n for n in notes)


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


def trainer_rank_scenarios(workdir: Path, size: Size, seed: int) -> list[Row]:
    """kill -9 and SIGSTOP of rank 1 mid-epoch under torchrun --max-restarts=1: committed steps exactly once,
    and how long until the fault is detected (SIGSTOP: the rank named) and the job is done."""
    images = workdir / "images"
    if not images.exists():
        make_image_folder(images, size.images, seed=seed)
    data = workdir / "rank-ds"
    if not (data / "manifest.json").exists():
        shardify(["write", str(images), str(data), "--max-samples-per-shard", "8", "--quiet"])
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    rows, epochs = [], max(3, 240 // size.images)
    for name, sig in (("kill -9", signal.SIGKILL), ("SIGSTOP", signal.SIGSTOP)):
        out = workdir / f"rank-{sig.name}"
        cmd = [torchrun, "--standalone", "--nproc_per_node=2", "--max-restarts=1", "--monitor-interval=0.2",
               "-m", "trainer", "--data", str(data), "--num-classes", "3", "--model", "mlp", "--batch-size", "2",
               "--image-size", "8", "--num-workers", "0", "--record-keys", "--checkpoint-every", "2",
               "--dist-timeout-s", "15", "--epochs", str(epochs), "--out", str(out),
               "--no-live", "--device", "cpu"]
        err_path = workdir / f"rank-{sig.name}.err"
        with open(err_path, "w") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env={**env(), "OMP_NUM_THREADS": "1"},
                                    start_new_session=True)
        try:
            keys0, began = out / "keys-rank0.jsonl", time.monotonic()
            while proc.poll() is None and time.monotonic() - began < 180:
                if keys0.exists() and len(keys0.read_text().splitlines()) >= 3:
                    break
                time.sleep(0.1)
            pid = rank_pid(proc.pid, 1)
            if pid is None or proc.poll() is not None:
                rows.append(Row(group="trainer", scenario=f"{name} of rank 1", figure="rank 1 not found mid-run",
                                passed=False, note=err_path.read_text()[-300:]))
                continue
            os.kill(pid, sig)
            hit, detected_s = time.monotonic(), None
            while proc.poll() is None and time.monotonic() - hit < 300:
                if detected_s is None and "stopped responding" in err_path.read_text():
                    detected_s = time.monotonic() - hit
                time.sleep(0.2)
            done_s = time.monotonic() - hit
            code = proc.poll()
        finally:
            kill_tree(proc.pid)  # ranks run in sessions of their own
            proc.wait(timeout=30)
        once, num_steps = _committed_once(out)
        resumed = _resumed_from_a_checkpoint(out)
        expected_steps = epochs * (size.images // (2 * 2))  # 2 ranks x batch 2, the tail dropped
        detect = (f"rank 1 named after {detected_s:.1f} s (--dist-timeout-s 15)" if detected_s is not None
                  else "rank not named" if sig == signal.SIGSTOP else "torchrun saw the exit")
        ok = (code == 0 and once and num_steps == expected_steps and resumed
              and (sig != signal.SIGSTOP or detected_s is not None))
        rows.append(Row(group="trainer", scenario=f"{name} of rank 1 mid-epoch, --max-restarts 1",
                        figure=f"{detect}; job done {done_s:.0f} s after the signal, exit {code}; restarted group "
                               f"resumed from a checkpoint: {'yes' if resumed else 'NO'}; {num_steps} of "
                               f"{expected_steps} steps committed, exactly once: {'yes' if once else 'NO'}",
                        passed=ok, note="" if ok else err_path.read_text()[-300:].replace("\n", " ")))
    return rows
