"""One writer per destination on local disk (and memory://): the lease of sharding/write/lease.py, the conditional
writes under it, and what users see: a second writer refused, a stale lease taken over, gc held off."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dataio.format.versions import LEASE_NAME
from dataio.storage.store import Store
from sharding.write.lease import Lease, LeaseError, LeaseInfo
from tests.sharding import blocked_writer
from tests.sharding.conftest import manifest_of, run

pytestmark = [pytest.mark.timeout(120)]


def _race(store: Store, num_threads: int = 8) -> list[bool]:
    barrier = threading.Barrier(num_threads)
    wins: list[bool] = []

    def one(i: int) -> None:
        barrier.wait()
        wins.append(store.create_exclusive("versions/lease.json", f"{i}".encode()))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(num_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return wins


@pytest.mark.parametrize("where", ["local", "memory"])
def test_conditional_writes_have_one_winner(tmp_path: Path, where: str) -> None:
    store = Store(str(tmp_path / "ds") if where == "local" else f"memory://lease-{tmp_path.name}/ds")
    assert sorted(_race(store)) == [False] * 7 + [True]
    data, tag = store.read_tagged("versions/lease.json")
    new = store.replace_if("versions/lease.json", b"mine", tag)
    assert new is not None and store.read_tagged("versions/lease.json") == (b"mine", new)
    assert store.replace_if("versions/lease.json", b"late", tag) is None  # the tag it read is stale now
    assert not store.remove_if("versions/lease.json", tag) and store.remove_if("versions/lease.json", new)
    assert store.read_tagged("versions/lease.json") is None


def _lease_of(dest: Path) -> LeaseInfo:
    info = LeaseInfo.parse((dest / LEASE_NAME).read_bytes())
    assert info is not None
    return info


def _plant(dest: Path, *, pid: int, host: str, heartbeat_age_s: float) -> None:
    """A lease as a writer elsewhere left it."""
    (dest / "versions").mkdir(parents=True, exist_ok=True)
    now = time.time()
    (dest / LEASE_NAME).write_bytes(LeaseInfo(host=host, pid=pid, command="write", token="theirs",
                                              started_s=now - 600, heartbeat_s=now - heartbeat_age_s).to_bytes())


def _journals(dest: Path) -> list[str]:
    return sorted(p.parent.name for p in (dest / "versions").glob("v*/journal.json"))


@pytest.mark.slow  # starts writer processes
def test_second_overwrite_is_refused_while_the_first_holds_the_lease(image_folder: Path, tmp_path: Path,
                                                                       capsys) -> None:
    dest, go = tmp_path / "ds", tmp_path / "go"
    assert run("write", image_folder, dest, "--workers", 1, "--quiet") == 0
    first = blocked_writer.start(go, "write", image_folder, dest, "--overwrite", "--workers", 1, "--quiet")
    try:
        blocked_writer.wait_until(first, lambda: (dest / "versions/v000002/journal.json").exists())
        assert run("write", image_folder, dest, "--overwrite", "--workers", 1, "--quiet") == 2
        err = capsys.readouterr().err
        assert f"process {first.pid}" in err and f"host {socket.gethostname()}" in err, err
        assert "last heartbeat" in err and "wait for that one to finish" in err
        assert _journals(dest) == ["v000001", "v000002"]  # the loser kept no journal of its own
    finally:
        go.touch()
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert "version v000002" in out
    assert json.loads((dest / "versions/v000002/journal.json").read_text())["state"] == "published"
    assert manifest_of(dest)["shards"]["path"][0].startswith("shards/v000002/")
    assert not (dest / LEASE_NAME).exists()  # released at the end


@pytest.mark.slow  # starts writer processes
@pytest.mark.parametrize("stale", ["dead pid", "old heartbeat"])
def test_resume_takes_over_the_lease_of_a_killed_writer(image_folder: Path, tmp_path: Path, capsys,
                                                        stale: str) -> None:
    dest, go = tmp_path / "ds", tmp_path / "go"
    first = blocked_writer.start(go, "write", image_folder, dest, "--workers", 1, "--quiet")
    blocked_writer.wait_until(first, lambda: (dest / "versions/v000001/journal.json").exists())
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=30)
    assert _lease_of(dest).pid == first.pid  # kill -9 leaves the lease ...
    holder, why = f"host {socket.gethostname()}, process {first.pid}", "no longer running"
    if stale == "old heartbeat":  # ... as if on another machine: its pid cannot be judged, its heartbeat can
        _plant(dest, pid=first.pid, host="other-host", heartbeat_age_s=90)
        holder, why = f"host other-host, process {first.pid}", "s ago (over 60 s)"
    assert run("write", image_folder, dest, "--resume", "--workers", 1) == 0  # ... and it has expired
    out = capsys.readouterr().out
    assert f"took over the expired lease of `shardify write` on {holder}" in out and why in out, out
    assert manifest_of(dest)["num_samples"] == 24 and not (dest / LEASE_NAME).exists()


def test_a_lease_without_heartbeat_for_a_minute_expires(image_folder: Path, tmp_path: Path, capsys) -> None:
    dest = tmp_path / "ds"
    _plant(dest, pid=1, host="other-host", heartbeat_age_s=30)  # alive elsewhere: its pid is not ours to judge
    assert run("gc", dest) == 2
    err = capsys.readouterr().err
    assert "host other-host, process 1" in err and "last heartbeat 30 s ago" in err
    _plant(dest, pid=1, host="other-host", heartbeat_age_s=90)
    assert run("write", image_folder, dest, "--workers", 1, "--quiet") == 0
    assert re.search(r"its last heartbeat was 9\d s ago \(over 60 s\)", capsys.readouterr().out)  # (90, 91: slow)


@pytest.mark.slow  # starts writer processes
def test_ctrl_c_releases_the_lease(image_folder: Path, tmp_path: Path) -> None:
    dest, go = tmp_path / "ds", tmp_path / "go"
    first = blocked_writer.start(go, "write", image_folder, dest, "--workers", 1, "--quiet")
    blocked_writer.wait_until(first, lambda: (dest / "versions/v000001/journal.json").exists())
    assert _lease_of(dest).pid == first.pid
    os.kill(first.pid, signal.SIGINT)
    _, err = first.communicate(timeout=30)
    assert first.returncode == 130, err
    assert not (dest / LEASE_NAME).exists()


def test_gc_refuses_while_a_writer_holds_the_lease(image_folder: Path, tmp_path: Path, capsys) -> None:
    dest = tmp_path / "ds"
    assert run("write", image_folder, dest, "--workers", 1, "--quiet") == 0
    with Lease(Store(str(dest)), "write --overwrite"):
        assert run("gc", dest, "--grace", "0") == 2
        assert f"`shardify write --overwrite` on host {socket.gethostname()}, process {os.getpid()}" \
            in capsys.readouterr().err
        assert run("gc", dest, "--dry-run") == 0  # deletes nothing: takes no lease
    assert run("gc", dest, "--grace", "0") == 0
    assert not (dest / LEASE_NAME).exists()


def test_a_writer_that_lost_its_lease_publishes_nothing(image_folder: Path, tmp_path: Path, monkeypatch) -> None:
    """A writer stalled past the expiry while another took over: it finds out before publishing, and leaves
    the journal (now the other's) alone."""
    import sharding.write.writer as writer
    from sharding.progress import Progress
    from sharding.sources.by_path import open_source

    dest = tmp_path / "ds"
    real = writer._run

    def taken_over(*args, **kwargs):
        results = real(*args, **kwargs)
        _plant(dest, pid=os.getpid(), host=socket.gethostname(), heartbeat_age_s=0)  # the taker's lease
        return results

    monkeypatch.setattr(writer, "_run", taken_over)
    source = open_source(str(image_folder))
    progress = Progress(total_samples=len(source.refs), total_bytes=1, what="write", quiet=True)
    try:
        with pytest.raises(LeaseError, match="taken over by `shardify write`"):
            writer.write_dataset(source, Store(str(dest)), writer.WriteConfig(max_samples_per_shard=10), progress)
    finally:
        progress.close()
    assert not (dest / "manifest.json").exists()
    assert json.loads((dest / "versions/v000001/journal.json").read_text())["state"] == "writing"
    assert _lease_of(dest).token == "theirs"  # not removed: it is not this writer's


def test_refused_write_to_a_new_folder_leaves_nothing(image_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(LeaseError):
        with Lease(Store(str(tmp_path / "held")), "write"):
            Lease(Store(str(tmp_path / "held")), "write").acquire()
    assert not (tmp_path / "held").exists()  # the lease's folders went with it


def test_the_heartbeat_refreshes_the_lease(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "ds"))
    with Lease(store, "write", heartbeat_s=0.05) as lease:
        deadline = time.monotonic() + 30
        while _lease_of(tmp_path / "ds").beat < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        lease.check()


@pytest.mark.slow  # starts writer processes
def test_pid_alive_sees_a_reaped_child_as_gone() -> None:
    from sharding.write.lease import pid_alive

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert pid_alive(os.getpid()) and not pid_alive(child.pid)


def test_gc_never_deletes_the_lease() -> None:
    from dataio.format.versions import StoredObject, plan_gc

    old = [StoredObject(path=LEASE_NAME, size=200, mtime_s=0.0),
           StoredObject(path="shards/shard-000000.tar", size=10, mtime_s=0.0)]
    plan = plan_gc(old, current_paths=frozenset(), current_parts_dir=None, current_published_s=None,
                   current_version=None, versions={}, now_s=1e9, grace_s=0.0)
    assert plan.delete == ("shards/shard-000000.tar",)


_WRONG_TYPES = {"host": 7, "pid": "12345", "command": ["write"], "token": None, "started_s": "0",
                "heartbeat_s": "1700000000", "beat": 1.5}


@pytest.mark.parametrize("field", sorted(_WRONG_TYPES))
def test_a_lease_field_of_the_wrong_type_is_a_damaged_lease_taken_over(tmp_path: Path, field: str) -> None:
    # `"pid": "12345"` used to raise TypeError in every write and gc until the file was deleted (issue 32, 4).
    now = time.time()
    doc = json.loads(LeaseInfo(host="h", pid=1, command="write", token="theirs", started_s=now,
                               heartbeat_s=now).to_bytes())
    (tmp_path / "versions").mkdir()
    (tmp_path / LEASE_NAME).write_text(json.dumps({**doc, field: _WRONG_TYPES[field]}))
    with Lease(Store(str(tmp_path)), "write") as lease:
        assert f"took over a damaged lease, {tmp_path / LEASE_NAME}" in lease.took_over
        assert f"its {field!r} is {_WRONG_TYPES[field]!r}" in lease.took_over, lease.took_over
    del doc["beat"]
    (tmp_path / LEASE_NAME).write_text(json.dumps(doc))
    assert LeaseInfo.read(json.dumps(doc).encode()) == (None, "it has no 'beat'")


def test_write_and_gc_take_over_a_lease_whose_pid_is_a_string(image_folder: Path, tmp_path: Path, capsys) -> None:
    dest = tmp_path / "ds"
    for command in (("write", image_folder, dest, "--workers", 1), ("gc", dest)):
        _plant(dest, pid=1, host="other-host", heartbeat_age_s=0)
        doc = json.loads((dest / LEASE_NAME).read_text())
        (dest / LEASE_NAME).write_text(json.dumps({**doc, "pid": "12345"}))
        assert run(*command) == 0
        out = capsys.readouterr().out
        assert "took over a damaged lease" in out and "its 'pid' is '12345' (a string), not an integer" in out, out
