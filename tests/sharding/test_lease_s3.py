"""The destination lease on a real S3 server (the pinned SeaweedFS on 127.0.0.1): its conditional writes
hold under concurrency, and two writers to one prefix are one writer and one refusal."""

from __future__ import annotations

import os
import signal
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dataio.format.manifest import read_manifest
from dataio.format.versions import LEASE_NAME
from dataio.storage.store import Store
from sharding.write.lease import Lease, LeaseInfo
from tests.sharding import blocked_writer
from tests.sharding.conftest import run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _flags(server) -> list[str]:
    return ["--endpoint-url", server.endpoint_url, "--access-key", server.key, "--secret-key", server.secret,
            "--region", "us-east-1"]


def _racing(num_threads: int, call) -> list:
    barrier = threading.Barrier(num_threads)

    def one(i: int):
        barrier.wait()
        return call(i)

    with ThreadPoolExecutor(num_threads) as pool:
        return list(pool.map(one, range(num_threads)))


def test_conditional_writes_hold_under_concurrency_on_seaweedfs(s3_server) -> None:
    store = Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options())
    assert store.exclusive_is_atomic
    for round_ in range(2):  # (SeaweedFS makes contending requests wait up to seconds: few rounds)
        rel = f"race-{round_}"
        wins = _racing(8, lambda i, rel=rel: store.create_exclusive(rel, f"writer {i}".encode()))
        assert wins.count(True) == 1, wins  # exactly one creator, and the object is the winner's
        assert store.read(rel) == f"writer {wins.index(True)}".encode()
        _, tag = store.read_tagged(rel)
        swaps = _racing(8, lambda i, rel=rel, tag=tag: store.replace_if(rel, f"taker {i}".encode(), tag))
        winners = [i for i, new in enumerate(swaps) if new is not None]
        assert len(winners) == 1, swaps  # one taker replaces the object it read, the others see it changed
        assert store.read_tagged(rel) == (f"taker {winners[0]}".encode(), swaps[winners[0]])
        assert not store.remove_if(rel, tag) and store.remove_if(rel, swaps[winners[0]])


def test_two_overwrites_of_one_s3_prefix_one_is_refused(s3_server, image_folder: Path, tmp_path: Path,
                                                         capsys) -> None:
    url, flags = f"s3://{s3_server.new_bucket()}/ds", _flags(s3_server)
    direct = Store(url, s3_server.options())
    assert run("write", image_folder, url, "--workers", 1, "--quiet", *flags) == 0
    go = tmp_path / "go"
    first = blocked_writer.start(go, "write", image_folder, url, "--overwrite", "--workers", 1, "--quiet", *flags)
    try:
        blocked_writer.wait_until(first, lambda: direct.exists("versions/v000002/journal.json"))
        assert run("write", image_folder, url, "--overwrite", "--workers", 1, "--quiet", *flags) == 2
        err = capsys.readouterr().err
        assert f"host {socket.gethostname()}, process {first.pid}" in err and "last heartbeat" in err, err
        assert s3_server.secret not in err
        assert run("gc", url, "--grace", "0", *flags) == 2  # gc waits for the writer too
    finally:
        go.touch()
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert "version v000002" in out
    assert read_manifest(direct).shard_paths[0].startswith("shards/v000002/")
    assert not direct.exists("versions/v000003/journal.json")  # the refused writer left no version
    assert direct.read_tagged(LEASE_NAME) is None  # (botocore: s3fs may answer from its listing cache)


def test_resume_takes_over_a_killed_writers_lease_on_s3(s3_server, image_folder: Path, tmp_path: Path,
                                                        capsys) -> None:
    url, flags = f"s3://{s3_server.new_bucket()}/ds", _flags(s3_server)
    direct = Store(url, s3_server.options())
    first = blocked_writer.start(tmp_path / "go", "write", image_folder, url, "--workers", 1, "--quiet", *flags)
    blocked_writer.wait_until(first, lambda: direct.exists("versions/v000001/journal.json"))
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=30)
    held = LeaseInfo.parse(direct.read(LEASE_NAME))
    assert held is not None and held.pid == first.pid  # kill -9 leaves it; its process is gone: expired
    assert run("write", image_folder, url, "--resume", "--workers", 1, *flags) == 0
    assert f"took over the expired lease of `shardify write` on host {socket.gethostname()}, process {first.pid}" \
        in capsys.readouterr().out
    assert read_manifest(direct).num_samples == 24 and direct.read_tagged(LEASE_NAME) is None


def test_a_store_that_ignores_if_none_match_gets_a_settled_lease(s3_server, monkeypatch) -> None:
    """A server that ignores If-None-Match creates the lease twice: the lease notices, waits, reads it back."""
    from dataio.storage import s3_ranges

    real = s3_ranges.put_if
    monkeypatch.setattr(s3_ranges, "put_if", lambda options, path, data, absent=False, etag=None: real(
        options, path, data, etag=etag) if etag else s3_ranges.client_for(options).put_object(
        Bucket=path.partition("/")[0], Key=path.partition("/")[2], Body=data)["ETag"])
    store = Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options())
    with Lease(store, "write", settle_s=0.1) as lease:
        assert not lease.atomic
        lease.check()
        lease.beat()
    assert store.read_tagged(LEASE_NAME) is None


def test_heartbeats_on_s3_notice_a_taker(s3_server) -> None:
    """Each heartbeat replaces the lease only if unchanged (If-Match): once another took it over, the next
    beat finds out, and check() (before the journal or the manifest is written) refuses."""
    import time

    from sharding.write.lease import LeaseError

    store = Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options())
    with Lease(store, "write", heartbeat_s=0.05) as lease:
        deadline = time.monotonic() + 30
        while LeaseInfo.parse(store.read(LEASE_NAME)).beat < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        lease.check()
        now = time.time()
        store.write_bytes(LEASE_NAME, LeaseInfo(host="elsewhere", pid=7, command="write --resume", token="theirs",
                                                started_s=now, heartbeat_s=now).to_bytes())
        while not lease.lost:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(LeaseError, match="taken over by `shardify write --resume` on host elsewhere"):
            lease.check()
    assert LeaseInfo.parse(store.read(LEASE_NAME)).token == "theirs"  # the taker's lease stays
