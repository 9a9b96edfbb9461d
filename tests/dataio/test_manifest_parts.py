"""The parted manifest: a JSON root plus Parquet parts, loaded through the same API, only in part."""

from __future__ import annotations

import json
import pickle

import pytest

from dataio import make_loader
from dataio.errors import ManifestError
from dataio.format import manifest_parts
from dataio.format.manifest import (
    LEGACY_JSON_VERSION,
    LEGACY_PARTED_VERSION,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    read_manifest,
    write_manifest,
)
from dataio.storage.store import RetryPolicy, Store
from tests.dataio.shardgen import write_parquet_dataset, write_tar_dataset
from tests.dataio.test_manifest import parquet_manifest, tar_manifest


class CountingStore(Store):
    """A Store that records every whole-file or ranged read, by relative path."""

    def __init__(self, url: str) -> None:
        super().__init__(url, retry=RetryPolicy(max_attempts=1))
        self.reads: list[str] = []

    def read(self, rel, start=None, end=None, *, expect_size=None):  # type: ignore[override]
        self.reads.append(rel)
        return super().read(rel, start, end, expect_size=expect_size)


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest_parts, "ROWS_PER_PART", 4)  # many parts from a few shards


def _write(store: Store, manifest, threshold: int = 2) -> dict:
    write_manifest(store, manifest, parts_threshold=threshold)
    return json.loads(store.read(MANIFEST_NAME))


@pytest.mark.parametrize("checksums", [True, False])
@pytest.mark.parametrize("make", [lambda **kw: tar_manifest(num_shards=11, **kw), parquet_manifest])
def test_round_trip_through_the_one_api(tmp_path, small_parts, make, checksums):
    manifest = make(checksums=checksums)
    store = Store(str(tmp_path))
    root = _write(store, manifest, threshold=0)
    version = MANIFEST_VERSION if checksums else LEGACY_PARTED_VERSION  # 2: a root written before checksums
    assert root["shardify_manifest"] == version and "shards" not in root
    assert root["fingerprint"] == manifest.fingerprint  # the same as the single-file form's
    assert root["skipped"] == [] and ("skipped" in root["parts"]) == bool(manifest.skipped)  # in a part of their own
    loaded = read_manifest(store)
    assert len(loaded.skipped) == len(manifest.skipped)
    assert loaded == manifest and loaded.fingerprint == manifest.fingerprint
    assert (loaded.num_samples, loaded.num_bytes, loaded.num_shards) == (
        manifest.num_samples, manifest.num_bytes, manifest.num_shards)
    assert [loaded.shard(i) for i in range(loaded.num_shards)] == [manifest.shard(i) for i in range(manifest.num_shards)]
    assert sorted(loaded.part_paths) == sorted(p for p in store.list() if p != MANIFEST_NAME)
    again = pickle.loads(pickle.dumps(loaded))  # what a loader worker gets
    assert again.shard(manifest.num_shards - 1) == manifest.shard(manifest.num_shards - 1)


def test_small_manifests_stay_one_file(tmp_path):
    store = Store(str(tmp_path))
    root = _write(store, tar_manifest(num_shards=3), threshold=3)
    assert root["shardify_manifest"] == MANIFEST_VERSION and store.list() == [MANIFEST_NAME]
    root = _write(store, tar_manifest(num_shards=3, checksums=False), threshold=3)
    assert root["shardify_manifest"] == LEGACY_JSON_VERSION


def test_loading_reads_the_root_and_counts_then_only_the_parts_in_use(tmp_path, small_parts):
    manifest = tar_manifest(num_shards=20)  # 5 table parts of 4 rows
    _write(Store(str(tmp_path)), manifest)
    store = CountingStore(str(tmp_path))
    loaded = read_manifest(store)
    parts_dir = f"{manifest_parts.PARTS_DIR}/{manifest.fingerprint}"
    assert store.reads == [MANIFEST_NAME, f"{parts_dir}/sizes.parquet"]
    assert list(loaded.shard_num_samples) == [10] * 20 and loaded.num_bytes == manifest.num_bytes
    assert loaded.shard(9).path == "shards/shard-000009.tar"
    assert loaded.shard_checksums[10] == manifest.shard_checksums[10]  # same part: no new read
    assert store.reads[2:] == [f"{parts_dir}/part-000002.parquet"]


def _damage(store: Store, rel: str) -> None:
    data = bytearray(store.read(rel))
    data[len(data) // 2] ^= 0xFF
    store.write_bytes(rel, bytes(data))


def _part(manifest, k: int) -> str:
    return f"{manifest_parts.PARTS_DIR}/{manifest.fingerprint}/part-{k:06d}.parquet"


@pytest.mark.parametrize("what", ["missing", "damaged", "sizes missing"])
def test_bad_parts_fail_naming_the_part(tmp_path, small_parts, what):
    manifest = tar_manifest(num_shards=12)
    store = Store(str(tmp_path), retry=RetryPolicy(max_attempts=1))
    _write(store, manifest)
    rel = _part(manifest, 1) if what != "sizes missing" else _part(manifest, 0).replace("part-000000", "sizes")
    if what == "damaged":
        _damage(store, rel)
    else:
        store.remove(rel)
    with pytest.raises(ManifestError, match="missing|damaged or replaced") as err:
        read_manifest(store).shard(5)
    assert store.url_of(rel) in str(err.value)


def test_a_root_over_another_versions_parts_is_refused(tmp_path, small_parts):
    old, new = tar_manifest(num_shards=12), tar_manifest(num_shards=13)
    store = Store(str(tmp_path), retry=RetryPolicy(max_attempts=1))
    _write(store, old)
    root = _write(store, new)
    # A part of the old version under the new version's name: it says whose it is.
    store.write_bytes(_part(new, 1), store.read(_part(old, 1)))
    with pytest.raises(ManifestError, match="belongs to another dataset version") as err:
        read_manifest(store).shard(4)
    assert _part(new, 1) in str(err.value)
    # A root pointing at the old version's directory: refused before any part is read.
    root["parts"]["dir"] = f"{manifest_parts.PARTS_DIR}/{old.fingerprint}"
    store.write_bytes(MANIFEST_NAME, json.dumps(root).encode())
    with pytest.raises(ManifestError, match="bad parts list"):
        read_manifest(store)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda r: r.update(num_samples=1), "num_samples"),
        (lambda r: r.update(num_shards=11), "expected 11 sample counts"),
        (lambda r: r["parts"]["tables"].pop(), "lists 2 table parts"),
        (lambda r: r["parts"]["tables"][0].update(path="../x.parquet"), "plain file name"),
        (lambda r: r.update(surprise=1), "unknown keys"),
    ],
)
def test_malformed_roots_are_refused(tmp_path, small_parts, change, match):
    store = Store(str(tmp_path), retry=RetryPolicy(max_attempts=1))
    root = _write(store, tar_manifest(num_shards=12))
    change(root)
    store.write_bytes(MANIFEST_NAME, json.dumps(root).encode())
    with pytest.raises(ManifestError, match=match):
        read_manifest(store)


def test_unsafe_paths_in_a_part_are_refused(tmp_path, small_parts):
    manifest = tar_manifest(num_shards=3)
    bad = manifest.__class__(**{**{f: getattr(manifest, f) for f in (
        "format", "fields", "shard_num_samples", "shard_num_bytes", "shard_checksums", "index_paths",
        "index_num_bytes", "index_checksums")}, "shard_paths": ("shards/a.tar", "../b.tar", "shards/c.tar")})
    store = Store(str(tmp_path))
    _write(store, bad)
    with pytest.raises(ManifestError, match="unsafe shard path"):
        read_manifest(store).shard(0)


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_the_loader_reads_a_parted_dataset_exactly_once(tmp_path, small_parts, fmt):
    store = Store(str(tmp_path / "ds"))
    sizes = [5, 0, 7, 3, 9, 4, 6]
    write = write_tar_dataset if fmt == "tar" else write_parquet_dataset
    manifest, shards = write(store, sizes)
    write_manifest(store, manifest, parts_threshold=1)  # the same shards, now listed in parts
    assert read_manifest(store).parted is not None
    keys = []
    for rank in range(2):
        with make_loader(store.raw_url, batch_size=2, num_workers=2, decode=None, rank=rank, world_size=2,
                         tail="pad") as loader:
            keys += [k for b in loader for k, m in zip(b["__key__"], b["mask"].tolist()) if m]
    assert sorted(keys) == sorted(s["__key__"] for shard in shards for s in shard)


def test_a_failed_part_write_publishes_no_root(tmp_path, small_parts, monkeypatch):
    store = Store(str(tmp_path), retry=RetryPolicy(max_attempts=1))
    written: list[str] = []
    real = Store.write_bytes

    def flaky(self, rel, data):
        if rel.endswith("part-000002.parquet"):
            raise OSError("disk full")
        written.append(rel)
        real(self, rel, data)

    monkeypatch.setattr(Store, "write_bytes", flaky)
    with pytest.raises(OSError, match="disk full"):
        write_manifest(store, tar_manifest(num_shards=12), parts_threshold=2)
    assert MANIFEST_NAME not in written and not store.exists(MANIFEST_NAME)  # the root goes last, or not at all
