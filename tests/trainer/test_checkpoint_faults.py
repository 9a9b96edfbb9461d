"""Issue 19 item 3: checkpoints are sealed by a checksum that resume verifies, and never end a run.

A damaged checkpoint (64 bytes flipped in its tensor data, same size) is skipped naming it; a full
disk (a real tmpfs, mounted inside `unshare --mount` so nothing stays mounted) or an S3 server
refusing every PUT (SeaweedFS behind the fault proxy) is reported while training goes on; the
summary counts stored and failed checkpoints, and a run left with none to resume from exits 3.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shlex
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from dataio.storage.store import Store
from tests.trainer.harness import REPO, env_for, finish, run_trainer, summary
from tools.delay_proxy import DelayProxy
from trainer import checkpoint as ckpt_io
from trainer.__main__ import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SYNTH = "synthetic:?samples=64&classes=4"
SLEEPY = ["--model", "tests.trainer.fakes:sleepy", "--batch-size", "4", "--image-size", "4", "--num-workers", "0",
          "--log-every", "1", "--no-live"]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _flip_tensor_bytes(path: Path, num_bytes: int = 64) -> None:
    """Invert `num_bytes` in the middle of the checkpoint's largest tensor storage; the size stays."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    assert info.file_size >= 2 * num_bytes, info
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
    data[start:start + num_bytes] = bytes(b ^ 0xFF for b in data[start:start + num_bytes])
    size = path.stat().st_size
    path.write_bytes(bytes(data))
    assert path.stat().st_size == size


def test_a_damaged_checkpoint_is_skipped_naming_it_and_resume_falls_back(tmp_path, capsys):
    out = tmp_path / "o"
    base = ["--data", SYNTH, "--model", "mlp", "--batch-size", "8", "--image-size", "4", "--num-workers", "0",
            "--checkpoint-every", "2", "--keep-checkpoints", "5", "--out", str(out), "--no-live"]
    assert main([*base, "--max-steps", "4"]) == 0
    newest = out / "checkpoints" / "ckpt-000000004.pt"
    assert torch.load(newest, weights_only=True)["step"] == 4  # still a plain torch.save file
    assert zipfile.ZipFile(newest).comment.startswith(b"shardify-checkpoint xxh3-128=")
    _flip_tensor_bytes(newest)
    capsys.readouterr()
    assert main([*base, "--max-steps", "6"]) == 0
    said = capsys.readouterr()
    text = said.out + said.err
    assert "skipped checkpoint ckpt-000000004.pt" in text and "checksum mismatch" in text, text[-3000:]
    assert "ckpt-000000002.pt: step 2" in text, text[-3000:]


def test_an_unsealed_checkpoint_loads_only_in_the_old_format(tmp_path):
    store = Store(str(tmp_path))
    for version in (1, 2):
        torch.save({"format_version": version, "x": torch.ones(2)}, tmp_path / f"ckpt-00000000{version}.pt")
    assert torch.equal(ckpt_io.load(store, "ckpt-000000001.pt")["x"], torch.ones(2))  # an older trainer's
    with pytest.raises(ckpt_io.CheckpointUnreadable, match="ckpt-000000002.pt: its checksum seal is missing"):
        ckpt_io.load(store, "ckpt-000000002.pt")


class _FullDisk:
    """A file that takes `room` bytes, then fails as a full disk does."""

    def __init__(self, room: int) -> None:
        self.room = room

    def write(self, data) -> int:  # noqa: ANN001
        self.room -= len(data)
        if self.room < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(data)

    def flush(self) -> None:
        pass


def test_a_failed_write_inside_torch_save_names_the_os_error(tmp_path, monkeypatch):
    store = Store(str(tmp_path))
    monkeypatch.setattr(store, "open_atomic", lambda name: contextlib.nullcontext(_FullDisk(1000)))
    # Before: torch's "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos ...".
    with pytest.raises(ckpt_io.CheckpointWriteError, match=r"ckpt-000000003\.pt: No space left on device"):
        ckpt_io.save(store, 3, {"x": torch.ones(4096)}, keep=2)


def _mountable(where: Path) -> str | None:
    """Why a tmpfs cannot be mounted in a private mount namespace here, or None if it can."""
    try:
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(where))}"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare is not available ({exc})"
    return None if proc.returncode == 0 else f"cannot mount a tmpfs in a mount namespace: {proc.stderr.strip()}"


def test_a_full_disk_is_reported_training_goes_on_and_none_stored_exits_3(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    why = _mountable(disk)
    if why is not None:
        pytest.skip(why)
    base = ["--data", SYNTH, *SLEEPY]
    a, b, c, d, kept = (tmp_path / n for n in ("a", "b", "c", "d", "kept"))  # c writes its --out on the disk
    # In the namespace, the four runs in one interpreter (tests/trainer/runs_in_one.py): two checkpoints
    # fit; then the disk is filled, and a run resumes and trains on through two failed saves (at 2 ranks:
    # test_s3_refusing_every_checkpoint below); then a fresh run on the full disk stores nothing at all;
    # then, the disk read-only (what root meets instead of a permission error), a run resumes and
    # trains on through a refused save.
    on_disk = shlex.quote(str(disk))
    steps = [
        ["sh", f"mount -t tmpfs -o size=2m tmpfs {on_disk}", True],
        ["trainer", str(a), [*base, "--checkpoint-dir", f"{disk}/c", "--out", str(a), "--max-steps", "4",
                             "--checkpoint-every", "2"]],
        ["sh", f"dd if=/dev/zero of={on_disk}/filler bs=4k 2>/dev/null", False],
        ["trainer", str(b), [*base, "--checkpoint-dir", f"{disk}/c", "--out", str(b), "--max-steps", "8",
                             "--checkpoint-every", "2"]],
        ["trainer", str(c), [*base, "--checkpoint-dir", f"{disk}/fresh", "--out", f"{disk}/c-out",
                             "--max-steps", "2"]],
        ["sh", f"mkdir {shlex.quote(str(kept))} && cp {on_disk}/c/ckpt-* {shlex.quote(str(kept))}/", True],
        ["sh", f"mount -o remount,ro {on_disk}", True],
        ["trainer", str(d), [*base, "--checkpoint-dir", f"{disk}/c", "--out", str(d), "--max-steps", "6"]],
    ]
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    script = f"{shlex.quote(sys.executable)} -m tests.trainer.runs_in_one {shlex.quote(str(tmp_path / 'steps.json'))}"
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=REPO,
                            env=env_for(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert finish(proc, timeout_s=200).returncode == 0
    rc = {p.name: int(Path(f"{p}.rc").read_text()) for p in (a, b, c, d)}
    said = {p.name: Path(f"{p}.out").read_text() + Path(f"{p}.err").read_text() for p in (a, b, c, d)}
    assert rc["a"] == 0, said["a"][-3000:]
    assert rc["b"] == 0, said["b"][-3000:]  # before: RuntimeError [enforce fail at inline_container.cc:672]
    assert "FAILED and was not recorded" in said["b"] and "No space left on device" in said["b"], said["b"][-3000:]
    assert [r["step"] for r in _records(b) if r["kind"] == "checkpoint_failed"] == [6, 8]
    assert max(r["step"] for r in _records(b) if r["kind"] == "train") == 8  # trained to the end
    facts = summary(b)["checkpoints"]
    assert (facts["stored"], facts["failed"], facts["last_stored_step"]) == (0, 2, 4)
    assert "checkpoints: 0 stored, 2 failed in this run; newest resumable: step 4" in said["b"]
    assert sorted(p.name for p in kept.iterdir() if p.suffix == ".pt") == ["ckpt-000000002.pt", "ckpt-000000004.pt"]
    assert not [p.name for p in kept.iterdir() if p.name.startswith(".")]  # no torn file
    assert rc["c"] == 3, said["c"][-3000:]
    assert "no checkpoint could be stored" in said["c"] and "nothing can be resumed" in said["c"], said["c"][-3000:]
    # Its --out on the full disk too (the default layout: OUT/checkpoints): each record it cannot
    # write is reported once, and the run still ends with its summary on the console.
    assert "metrics.jsonl (No space left on device); training goes on without it" in said["c"], said["c"][-3000:]
    assert "checkpoints: 0 stored, 1 failed in this run; newest resumable: NONE" in said["c"], said["c"][-3000:]
    assert rc["d"] == 0 and "Read-only file system" in said["d"], said["d"][-3000:]
    assert summary(d)["checkpoints"] == {**facts, "stored": 0, "failed": 1}


def test_s3_refusing_every_checkpoint_is_reported_and_the_run_exits_nonzero(s3_server, tmp_path):
    url = f"s3://{s3_server.new_bucket()}/run/ckpt"
    env = {"AWS_ACCESS_KEY_ID": s3_server.key, "AWS_SECRET_ACCESS_KEY": s3_server.secret}
    with DelayProxy(s3_server.endpoint_url, 0.0, error_rate=1.0, methods=("PUT",)) as proxy:
        result = run_trainer(["--data", SYNTH, *SLEEPY, "--out", str(tmp_path), "--checkpoint-dir", url,
                              "--s3-endpoint-url", proxy.url, "--max-steps", "4", "--dist-timeout-s", "20"],
                             nproc=2, env=env, timeout_s=150)
        assert proxy.stats.num_errors > 0
    said = result.stdout + result.stderr
    assert result.returncode != 0, said[-3000:]
    assert f"no checkpoint could be stored in {url}" in result.stderr, result.stderr[-3000:]
    # Rank 0 retried for half of --dist-timeout-s (20 s) while rank 1 waited in the collective, which
    # did not time out first (the default budget, 60 s, would have ended the job).
    assert "(budget 10 s)" in said and "timed out" not in said, said[-3000:]
    assert max(r["step"] for r in _records(tmp_path) if r["kind"] == "train") == 4  # trained to the end
    facts = summary(tmp_path)["checkpoints"]
    assert (facts["stored"], facts["failed"], facts["last_stored_step"]) == (0, 1, None)
    assert s3_server.secret not in said
