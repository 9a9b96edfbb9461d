"""Dataset versions: staged --overwrite, re-shard in place, gc, and kill -9 at any moment of a rewrite.

Before: `--overwrite` deleted the old dataset before writing anything, so a source failing
halfway (or kill -9) left neither dataset, and `shardify write DS DS --overwrite` destroyed DS.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from dataio.format.manifest import read_manifest
from dataio.format.versions import (
    JournalHead,
    StoredObject,
    VersionFacts,
    next_generation,
    plan_gc,
    shard_base,
    version_name,
)
from dataio.storage.store import Store
from tests.sharding.conftest import make_image_folder, run

HOUR = 3600.0
NOW = 1_000_000.0


def _obj(path: str, age_s: float) -> StoredObject:
    return StoredObject(path=path, size=1, mtime_s=NOW - age_s)


def _head(version: str, state: str, *, updated_ago: float = 0.0, retired_ago: float | None = None,
          fp: str | None = None) -> JournalHead:
    return JournalHead(version=version, fingerprint="f", state=state, updated_s=NOW - updated_ago,
                       retired_s=None if retired_ago is None else NOW - retired_ago, manifest_fingerprint=fp)


def _gc(objects, versions, *, current=("shards/v000003/shard-000000.tar",), current_version="v000003",
        published_ago=10 * HOUR, grace_s=HOUR):
    return plan_gc(objects, current_paths=frozenset(current), current_parts_dir=None,
                   current_published_s=NOW - published_ago, current_version=current_version,
                   versions=versions, now_s=NOW, grace_s=grace_s)


def test_version_names_and_where_shards_go() -> None:
    assert version_name(2) == "v000002" and shard_base(1) == "shards" and shard_base(12) == "shards/v000012"
    assert next_generation([]) == 1
    assert next_generation(["manifest.json", "shards/shard-000000.tar"]) == 2
    assert next_generation(["shards/v000004/shard-000000.tar", "versions/v000007/journal.json"]) == 8


def test_gc_keeps_the_current_version_live_writes_and_young_retirements() -> None:
    objects = [
        _obj("manifest.json", 20 * HOUR),
        _obj("shards/v000003/shard-000000.tar", 20 * HOUR),      # current
        _obj("shards/v000003/shard-000000.idx", 20 * HOUR),      # current, by stem
        _obj("shards/v000003/shard-000000.sources.json", 20 * HOUR),
        _obj("versions/v000003/journal.json", 20 * HOUR),
        _obj("shards/shard-000000.tar", 30 * HOUR),              # v1: retired long ago
        _obj("versions/v000001/journal.json", 30 * HOUR),
        _obj("shards/v000002/shard-000000.tar", 30 * HOUR),      # v2: retired 10 min ago
        _obj("versions/v000002/journal.json", 30 * HOUR),
        _obj("shards/v000004/shard-000000.tar", 5 * HOUR),       # v4: a live write (journal fresh)
        _obj("versions/v000004/journal.json", 0.1 * HOUR),
        _obj("shards/v000005/shard-000000.tar", 5 * HOUR),       # v5: killed write, journal stale
        _obj("versions/v000005/journal.json", 5 * HOUR),
        _obj("shards/v000006/shard-000001.tar", 0.2 * HOUR),     # no journal, but young
        _obj("shards/.shard-000009.tar.tmp-12-ab", 3 * HOUR),    # a temp file of a killed publish
        _obj("notes.txt", 100 * HOUR),                           # not ours: never touched
    ]
    versions = {
        "v000001": VersionFacts(head=_head("v000001", "published", retired_ago=20 * HOUR),
                                paths=frozenset({"shards/shard-000000.tar"})),
        "v000002": VersionFacts(head=_head("v000002", "published", retired_ago=0.2 * HOUR)),
        "v000003": VersionFacts(head=_head("v000003", "published", fp="x")),
        "v000004": VersionFacts(head=_head("v000004", "writing", updated_ago=0.1 * HOUR)),
        "v000005": VersionFacts(head=_head("v000005", "writing", updated_ago=5 * HOUR)),
    }
    plan = _gc(objects, versions)
    assert sorted(plan.delete) == ["shards/.shard-000009.tar.tmp-12-ab", "shards/shard-000000.tar",
                                   "shards/v000005/shard-000000.tar", "versions/v000001/journal.json",
                                   "versions/v000005/journal.json"]
    assert plan.foreign == ("notes.txt",) and plan.kept_young == 1
    assert plan.kept_current == 5 and plan.kept_protected == 4
    assert _gc(objects, versions, grace_s=0).delete.count("shards/v000002/shard-000000.tar") == 1


def test_gc_keeps_a_legacy_versions_shards_while_the_replacement_is_young() -> None:
    """A version without a journal (written before versions existed) was retired at the latest when
    the current manifest was published: its shards stay for the grace after that."""
    objects = [_obj("manifest.json", 0.1 * HOUR), _obj("shards/v000002/shard-000000.tar", 0.1 * HOUR),
               _obj("shards/shard-000000.tar", 50 * HOUR), _obj("shards/shard-000000.idx", 50 * HOUR)]
    versions = {"v000002": VersionFacts(head=_head("v000002", "published", fp="x"))}
    kw = {"current": ("shards/v000002/shard-000000.tar",), "current_version": "v000002"}
    assert _gc(objects, versions, published_ago=0.1 * HOUR, **kw).delete == ()
    assert _gc(objects, versions, published_ago=2 * HOUR, **kw).delete == (
        "shards/shard-000000.tar", "shards/shard-000000.idx")


def _keys(dest: Path) -> list[str]:
    from sharding.sources.tar import open_dataset

    return sorted(r.key for r in open_dataset(Store(str(dest)), str(dest)).refs)


def test_reshard_in_place_is_staged_and_verifies(image_folder: Path, tmp_path: Path, capsys) -> None:
    ds = tmp_path / "ds"
    assert run("write", image_folder, ds, "--max-samples-per-shard", 10, "--quiet") == 0
    before = _keys(ds)
    assert run("write", ds, ds, "--max-samples-per-shard", 4, "--quiet") == 2  # no --overwrite: refused
    assert run("write", ds, ds, "--max-samples-per-shard", 4, "--overwrite", "--quiet") == 0
    m = read_manifest(Store(str(ds)))
    assert m.num_shards == 6 and all(p.startswith("shards/v000002/") for p in m.shard_paths)
    assert m.label_names == ("ant", "bee", "cat") and _keys(ds) == before
    assert run("verify", ds, "--quiet") == 0


def test_overlapping_source_and_destination_are_refused(image_folder: Path, tmp_path: Path, capsys) -> None:
    assert run("write", image_folder, image_folder / "ds", "--quiet") == 2
    assert "overlap" in capsys.readouterr().err and not (image_folder / "ds").exists()
    assert run("write", image_folder, image_folder, "--overwrite", "--quiet") == 2
    assert "same place" in capsys.readouterr().err
    (tmp_path / "out").mkdir()
    assert run("write", tmp_path, tmp_path / "out", "--overwrite", "--quiet") == 2


def test_a_failing_overwrite_leaves_the_old_dataset_whole(image_folder: Path, tmp_path: Path, capsys) -> None:
    ds = tmp_path / "ds"
    assert run("write", image_folder, ds, "--max-samples-per-shard", 5, "--quiet") == 0
    old = read_manifest(Store(str(ds)))
    bad = make_image_folder(tmp_path / "bad", per_class=6)
    (bad / "cat" / "zz-broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")  # last: after shards are written
    assert run("write", bad, ds, "--max-samples-per-shard", 3, "--workers", 1, "--overwrite", "--quiet") == 2
    assert "zz-broken.jpg" in capsys.readouterr().err
    assert read_manifest(Store(str(ds))).shard_paths == old.shard_paths
    assert run("verify", ds, "--quiet") == 0
    assert list((ds / "shards" / "v000002").glob("*.tar"))  # the failed version's shards: gc's job
    assert run("gc", ds, "--grace", "0") == 0
    assert not list((ds / "shards" / "v000002").glob("*")) and run("verify", ds, "--quiet") == 0


def test_gc_says_what_it_removed_and_keeps_young_retirements(image_folder: Path, tmp_path: Path, capsys) -> None:
    ds = tmp_path / "ds"
    assert run("write", image_folder, ds, "--max-samples-per-shard", 12, "--quiet") == 0
    assert run("write", image_folder, ds, "--max-samples-per-shard", 8, "--overwrite", "--quiet") == 0
    capsys.readouterr()
    assert run("gc", ds) == 0  # default grace 1h: the version retired just now stays
    out = capsys.readouterr().out
    assert "removed 0 object(s)" in out and (ds / "shards" / "shard-000000.tar").exists()
    assert run("gc", ds, "--grace", "0", "--dry-run") == 0
    # 2 old shards x (tar, idx, sums, sources.json) + the old journal's head and batch
    assert "would remove 10 object(s)" in capsys.readouterr().out and (ds / "shards" / "shard-000000.tar").exists()
    assert run("gc", ds, "--grace", "0") == 0
    out = capsys.readouterr().out
    assert "removed shards/shard-000000.tar" in out and "removed shards/shard-000001.idx" in out
    assert "removed shards/shard-000001.sums" in out
    assert not (ds / "shards" / "shard-000000.tar").exists() and run("verify", ds, "--quiet") == 0


# --- kill -9 at any moment of a rewrite --------------------------------------------------------


def _start(src: Path, dest: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "sharding.cli", "write", str(src), str(dest), "--workers", "2",
           "--max-samples-per-shard", "3", "--overwrite", "--quiet"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            cwd=Path(__file__).resolve().parents[2])


def _kill_when(proc: subprocess.Popen, ready, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        while not ready() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate(timeout=30)


def _whole(ds: Path, sizes: set[int]) -> int:
    m = read_manifest(Store(str(ds)))
    assert m.num_samples in sizes
    assert run("verify", ds, "--quiet", "--workers", 1) == 0
    return m.num_samples


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_kill_9_at_any_moment_leaves_the_old_or_the_new_dataset(tmp_path: Path) -> None:
    old_src = make_image_folder(tmp_path / "old", per_class=4)
    new_src = make_image_folder(tmp_path / "new", per_class=40, seed=1)
    for p in list(new_src.rglob("*.jpg"))[::2]:  # bigger files: the write takes a moment
        Image.effect_noise((300, 300), 64).convert("RGB").save(p, quality=95)
    ds = tmp_path / "ds"
    assert run("write", old_src, ds, "--quiet") == 0
    sizes = {12, 120}

    def shards_of_new() -> int:  # in the version being written (the newest directory)
        dirs = sorted((ds / "shards").glob("v*"))
        return sum(1 for _ in dirs[-1].glob("shard-*.tar")) if dirs else 0

    moments = [lambda: True,                                   # at once: while scanning
               lambda: shards_of_new() >= 1,                    # the first new shard is out
               lambda: shards_of_new() >= 30]                   # most of them are out
    seen = set()
    for ready in moments:
        proc = _start(new_src, ds)
        _kill_when(proc, ready)
        seen.add(_whole(ds, sizes))
    # And once more, killed right after the manifest appears or at the end: the new one, whole.
    proc = _start(new_src, ds)
    before = (ds / "manifest.json").stat().st_mtime_ns
    _kill_when(proc, lambda: (ds / "manifest.json").stat().st_mtime_ns != before)
    assert _whole(ds, sizes) == 120 or proc.returncode != 0
    assert run("write", new_src, ds, "--overwrite", "--quiet") == 0 and _whole(ds, sizes) == 120
    assert run("gc", ds, "--grace", "0") == 0 and _whole(ds, sizes) == 120
    assert seen <= sizes


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_gc_on_s3_removes_retired_versions_and_aborts_stale_uploads(s3_server, image_folder: Path, capsys) -> None:
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ds"
    flags = ["--endpoint-url", s3_server.endpoint_url, "--access-key", s3_server.key, "--secret-key",
             s3_server.secret, "--region", "us-east-1", "--quiet"]
    assert run("write", image_folder, url, "--max-samples-per-shard", 12, *flags) == 0
    assert run("write", url, url, "--max-samples-per-shard", 8, "--overwrite", *flags) == 0  # in place
    client = s3_server.client()
    upload = client.create_multipart_upload(Bucket=bucket, Key="ds/shards/v000003/shard-000000.tar")
    store = Store(url, s3_server.options())
    assert store.exists("shards/shard-000000.tar")
    capsys.readouterr()
    assert run("gc", url, "--grace", "0", *flags[:-1]) == 0
    out = capsys.readouterr().out
    assert "removed shards/shard-000000.tar" in out and "aborted 1 stale multipart upload" in out
    assert not store.exists("shards/shard-000000.tar")
    uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads") or []
    assert upload["UploadId"] not in {u["UploadId"] for u in uploads}
    assert run("verify", url, *flags) == 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kill_9_mid_rewrite_on_s3_leaves_the_old_or_the_new_dataset(s3_server, tmp_path: Path) -> None:
    old_src = make_image_folder(tmp_path / "old", per_class=4)
    new_src = make_image_folder(tmp_path / "new", per_class=20, seed=1)
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ds"
    flags = ["--endpoint-url", s3_server.endpoint_url, "--access-key", s3_server.key, "--secret-key",
             s3_server.secret, "--region", "us-east-1", "--quiet"]
    assert run("write", old_src, url, *flags) == 0
    client = s3_server.client()

    def new_shards() -> int:
        listed = client.list_objects_v2(Bucket=bucket, Prefix="ds/shards/v").get("Contents") or []
        return sum(1 for o in listed if o["Key"].endswith(".tar"))

    for ready in (lambda: True, lambda: new_shards() >= 2):
        cmd = [sys.executable, "-m", "sharding.cli", "write", str(new_src), url, "--workers", "2",
               "--max-samples-per-shard", "3", "--overwrite", *flags]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                cwd=Path(__file__).resolve().parents[2])
        _kill_when(proc, ready)
        m = read_manifest(Store(url, s3_server.options()))
        assert m.num_samples in (12, 60)
        assert run("verify", url, "--workers", 1, *flags) == 0
    assert run("write", new_src, url, "--overwrite", *flags) == 0
    assert run("gc", url, "--grace", "0", *flags[:-1]) == 0
    assert read_manifest(Store(url, s3_server.options())).num_samples == 60
    assert run("verify", url, *flags) == 0


def test_gc_reads_journal_rows_only_of_the_first_version(image_folder: Path, tmp_path: Path, monkeypatch) -> None:
    """A journal's rows repeat its manifest's; gc read every version's on every run (growing with all
    the shards kept). Later versions sit in their own shards/vN/: their heads are enough."""
    from sharding.write.collect import collect

    ds = tmp_path / "ds"
    for per_shard in (12, 8, 6):
        assert run("write", image_folder, ds, "--max-samples-per-shard", per_shard, "--overwrite", "--quiet") == 0
    read = []
    plain = Store.read
    monkeypatch.setattr(Store, "read", lambda self, rel, *a, **kw: read.append(rel) or plain(self, rel, *a, **kw))
    report = collect(Store(str(ds)))  # default grace: v2, retired just now, stays whole
    batches = sorted(r for r in read if "/shards-" in r)
    assert batches and all(r.startswith("versions/v000001/") for r in batches)
    assert report.removed == ()
    v2 = sorted((ds / "shards" / "v000002").glob("*.tar"))
    assert v2 and all(p.exists() for p in v2)


def test_gc_cancels_recorded_sessions_only_of_versions_no_longer_written(tmp_path: Path, monkeypatch) -> None:
    from dataclasses import replace

    from dataio.format.versions import JournalHead, JournalSessions, VersionFacts
    from sharding.write.collect import cancel_sessions

    store, now = Store(str(tmp_path)), 10_000.0
    cancelled: list[str] = []
    monkeypatch.setattr(Store, "cancel_session", lambda self, uri: cancelled.append(uri) or 499)
    for version in ("v000001", "v000002", "v000003"):
        JournalSessions(version=version).record(store, f"shards/{version}/shard-000000.tar", f"https://u/{version}")
    head = JournalHead(version="v000001", fingerprint="f")
    versions = {"v000001": VersionFacts(head=replace(head, state="writing", updated_s=now - 5)),  # live
                "v000002": VersionFacts(head=replace(head, version="v000002", state="writing", updated_s=now - 99)),
                "v000003": VersionFacts(head=replace(head, version="v000003", state="failed", updated_s=now))}
    done = cancel_sessions(store, store.list(), versions, now_s=now, grace_s=60)
    assert sorted(done) == ["shards/v000002/shard-000000.tar", "shards/v000003/shard-000000.tar"]
    assert sorted(cancelled) == ["https://u/v000002", "https://u/v000003"]
    assert [rel.split("/")[1] for rel in store.list() if "/sessions/" in rel] == ["v000001"]  # the live one's kept


def test_gc_dry_run_names_the_sessions_it_would_cancel_and_cancels_none(tmp_path: Path, monkeypatch) -> None:
    from dataio.format.versions import JournalHead, JournalSessions
    from sharding.gc import describe
    from sharding.write import collect as collect_mod

    store, now = Store(str(tmp_path)), 10_000.0
    cancelled: list[str] = []
    monkeypatch.setattr(Store, "cancel_session", lambda self, uri: cancelled.append(uri) or 499)
    JournalSessions(version="v000002").record(store, "shards/v000002/shard-000000.tar", "https://u/v000002")
    head = JournalHead(version="v000002", fingerprint="f", state="failed", updated_s=now)
    monkeypatch.setattr(collect_mod, "journal_versions", lambda names: ["v000002"])
    monkeypatch.setattr(collect_mod, "read_journal", lambda store, version, names: (head, []))
    report = collect_mod.collect(store, now_s=now, grace_s=60, dry_run=True)
    assert report.cancelled_sessions == ("shards/v000002/shard-000000.tar",) and cancelled == []
    assert any("/sessions/" in rel for rel in store.list())  # its record stays too
    lines = describe(report, str(tmp_path), dry_run=True)
    assert "would cancel 1 stale resumable upload session(s)" in lines[0]
    assert "  would cancel upload session of shards/v000002/shard-000000.tar" in lines
