"""`shardify write --resume` after an interrupted write, and `shardify append`, on the dataset versions
(journal, manifest versions) of dataio.format.versions; loader states across an append."""

from __future__ import annotations

import json
import time

import psutil
import pytest

import sharding.write.writer
from dataio import StateError, make_loader
from dataio.format.manifest import read_manifest
from dataio.storage.store import Store
from tests.sharding.conftest import make_image_folder, manifest_of, run

pytestmark = pytest.mark.timeout(180)
WRITE_SHARD = sharding.write.writer.write_shard
ARGS = ("--max-samples-per-shard", 4, "--workers", 1, "--quiet", "--shuffle", "--seed", 5)


def interrupt_after(monkeypatch, num_shards: int) -> list[int]:
    """Make the in-process write stop (as Ctrl-C does) when it starts shard number `num_shards`."""
    real, calls = WRITE_SHARD, []

    def flaky(job, task, *args, **kw):
        calls.append(task.index)
        if len(calls) > num_shards:
            raise KeyboardInterrupt
        return real(job, task, *args, **kw)

    monkeypatch.setattr(sharding.write.writer, "write_shard", flaky)
    return calls


def test_resume_writes_only_the_missing_shards_and_equals_an_uninterrupted_run(image_folder, tmp_path,
                                                                               monkeypatch, capsys) -> None:
    dest, whole = tmp_path / "ds", tmp_path / "whole"
    assert run("write", image_folder, whole, *ARGS) == 0
    interrupt_after(monkeypatch, 3)
    assert run("write", image_folder, dest, *ARGS) == 130
    assert "--resume" in capsys.readouterr().err and not (dest / "manifest.json").exists()
    calls = interrupt_after(monkeypatch, 100)
    assert run("write", image_folder, dest, *ARGS, "--resume") == 0
    assert sorted(calls) == [3, 4, 5]  # shards 0-2 were confirmed in the journal: kept
    a, b = manifest_of(dest), manifest_of(whole)
    for doc in (a, b):
        doc.pop("created_utc"), doc.pop("tool_version")
    assert a == b  # the same shards, paths, checksums and sources as the uninterrupted run
    for rel in b["shards"]["path"]:
        assert (dest / rel).read_bytes() == (whole / rel).read_bytes()
        side = rel.rsplit(".", 1)[0] + ".sources.json"
        assert (dest / side).read_bytes() == (whole / side).read_bytes()
    assert run("write", image_folder, dest, *ARGS, "--resume") == 2
    assert "no interrupted write to resume" in capsys.readouterr().err


def test_resume_refuses_other_options_or_another_source(image_folder, tmp_path, monkeypatch, capsys) -> None:
    dest = tmp_path / "ds"
    interrupt_after(monkeypatch, 2)
    assert run("write", image_folder, dest, *ARGS) == 130
    capsys.readouterr()
    assert run("write", image_folder, dest, *ARGS, "--resume", "--format", "parquet") == 2
    assert "write options ['format'] changed" in capsys.readouterr().err
    (image_folder / "ant" / "img1.jpg").unlink()
    assert run("write", image_folder, dest, *ARGS, "--resume") == 2
    err = capsys.readouterr().err
    assert "the source" in err and "--overwrite instead of --resume" in err
    assert not (dest / "manifest.json").exists()


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_append_adds_a_version_old_loaders_keep_reading(image_folder, tmp_path, fmt) -> None:
    dest = tmp_path / "ds"
    assert run("write", image_folder, dest, "--format", fmt, *ARGS) == 0
    old = read_manifest(Store(str(dest)))
    more = make_image_folder(tmp_path / "more", per_class=5, classes=("bee",), seed=9)
    before = make_loader(str(dest), batch_size=4, decode=None, num_workers=0, tail="pad")
    assert run("append", more, dest, "--max-samples-per-shard", 4, "--workers", 1, "--quiet") == 0
    new = read_manifest(Store(str(dest)))
    assert new.num_samples == old.num_samples + 5 and new.shard_paths[: old.num_shards] == old.shard_paths
    assert new.label_names == old.label_names and new.format == fmt and new.fields == old.fields
    assert all("/v000002/" in p for p in new.shard_paths[old.num_shards:])
    assert sum(len(b["__key__"]) for b in before) == old.num_samples  # the old version, still whole
    before.close()
    with make_loader(str(dest), batch_size=1, decode=None, num_workers=0) as after:
        got = {k: int(lab) for b in after for k, lab in zip(b["__key__"], b["label"])}
    assert len(got) == 29 and [got[f"{24 + i:06d}"] for i in range(5)] == [1] * 5  # bee keeps label 1
    assert run("verify", dest, "--quiet", "--workers", 1) == 0


def test_append_refuses_other_labels_or_fields(image_folder, tmp_path, capsys) -> None:
    dest = tmp_path / "ds"
    assert run("write", image_folder, dest, "--format", "parquet", *ARGS) == 0
    dogs = make_image_folder(tmp_path / "dogs", per_class=2, classes=("dog",))
    assert run("append", dogs, dest, "--workers", 1, "--quiet") == 2
    assert "label names ['dog'] are not among the dataset's ['ant', 'bee', 'cat']" in capsys.readouterr().err
    table = tmp_path / "t.csv"
    table.write_text(f"path,label,caption\n{image_folder.name}/ant/img1.jpg,ant,hello\n")
    assert run("append", table, dest, "--workers", 1, "--quiet") == 2
    assert "fields ['caption:str']" in capsys.readouterr().err
    assert read_manifest(Store(str(dest))).num_samples == 24  # nothing half-published


def test_loader_state_across_an_append(image_folder, tmp_path) -> None:
    dest = tmp_path / "ds"
    assert run("write", image_folder, dest, *ARGS) == 0
    kw = {"batch_size": 4, "decode": None, "num_workers": 0, "seed": 1}
    with make_loader(str(dest), **kw) as loader:
        it = iter(loader)
        next(it)
        mid = json.loads(json.dumps(loader.state_dict()))
        list(it)
        boundary = json.loads(json.dumps(loader.state_dict()))
    more = make_image_folder(tmp_path / "more", per_class=4, classes=("cat",), seed=3)
    assert run("append", more, dest, "--workers", 1, "--quiet") == 0
    with make_loader(str(dest), **kw) as loader:
        with pytest.raises(StateError, match=r"middle of epoch 0 of another version.*epoch boundary"):
            loader.load_state_dict(mid)
        loader.load_state_dict(boundary)  # carries over: the next epoch, on the new version
        assert loader.epoch == 1
        loader.set_epoch(1)
        assert sum(len(b["__key__"]) for b in loader) == 28


@pytest.mark.slow
def test_resume_after_kill_9_gives_the_uninterrupted_dataset(tmp_path) -> None:
    import os
    import signal

    import subprocess
    import sys

    from tests.sharding.test_interrupt import _wait_gone

    folder = make_image_folder(tmp_path / "images", per_class=400, size=384)
    dest, whole = tmp_path / "ds", tmp_path / "whole"
    flags = ("--workers", 2, "--max-samples-per-shard", 4, "--quiet", "--validate", "full")
    # The journal records shards every 50 ms (default 2 s): the kill lands early in the write, after
    # its first recorded shards, however fast this machine writes (a fast one published first).
    proc = subprocess.Popen([sys.executable, "-m", "sharding.cli", "write", str(folder), str(dest), *map(str, flags),
                             "--journal-every", "0.05"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not list(dest.glob("versions/*/shards-*.json")):  # the journal's first batch
            if proc.poll() is not None:
                pytest.skip("the write finished before its journal's first flush: nothing to kill")
            assert time.monotonic() < deadline
            time.sleep(0.01)
        workers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        _wait_gone(workers)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    if (dest / "manifest.json").exists():
        pytest.skip("the write published before it was killed: nothing to resume")
    journal = [json.loads(p.read_text()) for p in dest.glob("versions/*/shards-*.json")]
    assert 0 < sum(len(b["shards"]) for b in journal) < 300  # killed with some shards recorded, not all
    assert run("write", folder, dest, *flags, "--resume") == 0
    assert run("write", folder, whole, *flags) == 0
    a, b = manifest_of(dest), manifest_of(whole)
    assert a["shards"] == b["shards"] and a["num_samples"] == 1200


def test_every_shard_is_on_disk_before_the_journal_or_the_manifest_names_it(image_folder, tmp_path,
                                                                             monkeypatch) -> None:
    # Workers write shards without an fsync each; the writing process fsyncs every batch of them
    # (files and their directories) before its journal records them, and so before the manifest.
    import os

    from dataio.format.versions import Journal

    synced: set[str] = set()
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.add(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    recorded: list[list[str]] = []
    flush = Journal.flush

    def checking_flush(self) -> None:
        files = [os.path.realpath(tmp_path / "ds" / f) for row in self.pending
                 for f in (row["path"], row["index_path"], row["path"].replace(".tar", ".sums"),
                           row["path"].replace(".tar", ".sources.json"))]
        flush(self)
        missing = [f for f in files if f not in synced]
        assert not missing, missing  # each was fsynced before the batch naming it was written
        assert {os.path.dirname(f) for f in files} <= synced  # and its directory (the rename)
        recorded.append(files)

    monkeypatch.setattr(Journal, "flush", checking_flush)
    assert run("write", image_folder, tmp_path / "ds", "--workers", 1, "--max-samples-per-shard", 2,
               "--quiet") == 0
    assert sum(len(files) for files in recorded) == 4 * len(manifest_of(tmp_path / "ds")["shards"]["path"])
