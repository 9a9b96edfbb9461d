"""The manifest: round trip, refusal of what is unsafe or unknown, a 100k-shard round trip."""

from __future__ import annotations

import json

import pytest

from dataio import ManifestError
from dataio.format.manifest import (
    MANIFEST_NAME,
    Checksummer,
    Field,
    Manifest,
    checksum_bytes,
    label_histogram,
    read_manifest,
    write_manifest,
)
from dataio.storage.store import RetryPolicy, Store

FIELDS = (Field(name="jpg", type="image"), Field(name="cls", type="int"))


def tar_manifest(num_shards: int = 3, samples_per_shard: int = 10, *, checksums: bool = True) -> Manifest:
    return Manifest(
        format="tar",
        fields=FIELDS,
        shard_paths=tuple(f"shards/shard-{i:06d}.tar" for i in range(num_shards)),
        shard_num_samples=(samples_per_shard,) * num_shards,
        shard_num_bytes=tuple(1024 * samples_per_shard + i for i in range(num_shards)),
        shard_checksums=tuple(f"{i:016x}" for i in range(num_shards)),
        index_paths=tuple(f"shards/shard-{i:06d}.idx" for i in range(num_shards)),
        index_num_bytes=(200,) * num_shards,
        index_checksums=tuple(f"{i + 7:016x}" for i in range(num_shards)),
        tool_version="0.1.0",
        created_utc="2026-01-01T00:00:00Z",
        source="/data/imagenet",
        label_names=("cat", "dog"),
        skipped=({"key": "000007", "reason": "corrupt"},),
        sums_checksums=tuple(f"{i + 99:016x}" for i in range(num_shards)) if checksums else (),
    )


def parquet_manifest(*, checksums: bool = True) -> Manifest:
    return Manifest(
        format="parquet", fields=FIELDS, shard_paths=("shards/shard-000000.parquet",),
        shard_num_samples=(10,), shard_num_bytes=(5000,), shard_checksums=("ab" * 8,), row_groups=((4, 4, 2),),
        row_group_checksums=(("12" * 16, "34" * 16, "56" * 16),) if checksums else (),
    )


@pytest.fixture
def store(tmp_path):
    return Store(str(tmp_path), retry=RetryPolicy(max_attempts=1))


def _write_doc(store: Store, doc) -> None:
    store.write_bytes(MANIFEST_NAME, json.dumps(doc).encode())


@pytest.mark.parametrize("checksums", [True, False])
@pytest.mark.parametrize("make", [tar_manifest, parquet_manifest])
def test_round_trip(store, make, checksums):
    manifest = make(checksums=checksums)
    write_manifest(store, manifest)
    assert json.loads(store.read(MANIFEST_NAME))["shardify_manifest"] == (3 if checksums else 1)
    loaded = read_manifest(store)
    assert loaded.has_read_checksums == checksums and loaded.version == (3 if checksums else 1)
    assert loaded == manifest
    assert loaded.fingerprint == manifest.fingerprint
    assert loaded.num_samples == manifest.num_samples and loaded.num_bytes == manifest.num_bytes
    assert loaded.shard(0) == manifest.shard(0)
    assert loaded.field_names == ("jpg", "cls")


def test_round_trip_on_s3(s3_server):
    store = Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options())
    write_manifest(store, tar_manifest())
    assert read_manifest(store) == tar_manifest()
    assert s3_server.secret not in store.read(MANIFEST_NAME).decode()  # credentials never land in it


def test_fingerprint_follows_content():
    a, b = tar_manifest(), tar_manifest(num_shards=4)
    assert a.fingerprint == tar_manifest().fingerprint != b.fingerprint


def test_shard_view():
    info = tar_manifest().shard(1)
    assert (info.path, info.num_samples, info.index_path) == ("shards/shard-000001.tar", 10, "shards/shard-000001.idx")
    assert parquet_manifest().shard(0).row_groups == (4, 4, 2)


def test_unknown_version_is_refused(store):
    doc = tar_manifest().to_json() | {"shardify_manifest": 4}
    _write_doc(store, doc)
    with pytest.raises(ManifestError, match="version 4 is not supported.*upgrade shardify"):
        read_manifest(store)


@pytest.mark.parametrize("bad", ["/etc/passwd", "../other/shard.tar", "shards/../../x.tar", "s3://b/x.tar", ""])
@pytest.mark.parametrize("column", ["path", "index_path"])
def test_paths_outside_the_prefix_are_refused(store, bad, column):
    doc = tar_manifest().to_json()
    doc["shards"][column][1] = bad
    _write_doc(store, doc)
    with pytest.raises(ManifestError, match="unsafe shard path") as err:
        read_manifest(store)
    assert store.url_of(MANIFEST_NAME) in str(err.value)


def test_corrupt_json_is_refused_with_the_url(store):
    store.write_bytes(MANIFEST_NAME, b'{"shardify_manifest": 1, "format": "ta')
    with pytest.raises(ManifestError, match="not valid JSON") as err:
        read_manifest(store)
    assert MANIFEST_NAME in str(err.value)
    store.write_bytes(MANIFEST_NAME, b"\xff\xfe not utf-8")
    with pytest.raises(ManifestError, match="not valid JSON"):
        read_manifest(store)


def test_missing_manifest_means_no_dataset(store):
    with pytest.raises(ManifestError, match="does not exist.*not a shardify dataset.*shardify write"):
        read_manifest(store)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda d: d.pop("shardify_manifest"), "not a shardify manifest"),
        (lambda d: d.update(extra=1), "unknown keys"),
        (lambda d: d.update(checksum_algorithm="md5"), "checksum algorithm"),
        (lambda d: d.update(format="zip"), "format must be one of"),
        (lambda d: d["shards"].pop("index_path"), "missing"),
        (lambda d: d["shards"].pop("sums_checksum"), "missing"),  # version 3 carries them
        (lambda d: d["shards"]["sums_checksum"].__setitem__(0, "xyz"), "malformed.*16 hex"),
        (lambda d: d["shards"]["sums_checksum"].pop(), "malformed.*one entry per shard"),
        (lambda d: d.update(num_samples=1), "num_samples"),
        (lambda d: d["shards"]["num_samples"].__setitem__(0, -10), "negative"),
        (lambda d: d["shards"]["num_samples"].pop(), "malformed"),
        (lambda d: d["fields"].append({"name": "x", "type": "weird"}), "malformed"),
    ],
)
def test_malformed_manifests_are_refused(store, change, match):
    doc = tar_manifest().to_json()
    change(doc)
    _write_doc(store, doc)
    with pytest.raises(ManifestError, match=match):
        read_manifest(store)


def test_parquet_row_groups_must_add_up(store):
    doc = parquet_manifest().to_json()
    doc["shards"]["row_groups"] = [[4, 4]]
    _write_doc(store, doc)
    with pytest.raises(ManifestError, match="row-group"):
        read_manifest(store)


def test_parquet_row_group_checksums_follow_the_row_groups(store):
    doc = parquet_manifest().to_json()
    doc["shards"]["row_group_checksums"] = [["12" * 16]]  # three row groups, one entry
    _write_doc(store, doc)
    with pytest.raises(ManifestError, match="one entry per row group"):
        read_manifest(store)


def test_constructor_checks_arguments():
    with pytest.raises(ValueError):
        Manifest(format="zip", fields=(), shard_paths=(), shard_num_samples=(), shard_num_bytes=(), shard_checksums=())
    with pytest.raises(ValueError, match="one entry per shard"):
        Manifest(format="tar", fields=(), shard_paths=("a",), shard_num_samples=(1,), shard_num_bytes=(1,),
                 shard_checksums=("x",))


def test_checksums():
    data = b"hello world" * 1000
    summer = Checksummer()
    for i in range(0, len(data), 777):
        summer.update(data[i : i + 777])
    assert summer.hexdigest() == checksum_bytes(data) and len(checksum_bytes(data)) == 16
    assert summer.num_bytes == len(data)
    assert checksum_bytes(b"a") != checksum_bytes(b"b")
    assert label_histogram([3, 1, 3]) == {1: 1, 3: 2}


def test_100k_shard_manifest_round_trips(store):
    # How fast it loads is a question for a benchmark, not a test (STYLE 10): this checks it loads whole.
    manifest = tar_manifest(num_shards=100_000, samples_per_shard=50_000)
    write_manifest(store, manifest)
    loaded = read_manifest(store)
    assert loaded.num_shards == 100_000 and loaded.num_samples == 5_000_000_000


@pytest.mark.parametrize("make", [tar_manifest, parquet_manifest])
def test_forged_sample_counts_are_refused_before_any_plan(store, make):
    """Issue 9: num_samples of 1e12 made numpy try to allocate terabytes; now ManifestError, no I/O."""
    doc = make().to_json()
    doc["shards"]["num_samples"][0] = 10**12
    if doc["format"] == "parquet":
        doc["shards"]["row_groups"][0] = [10**12]
    doc["num_samples"] = sum(doc["shards"]["num_samples"])
    _write_doc(store, doc)
    with pytest.raises(ManifestError, match=r"claims 1000000000000 samples in \d+ bytes.*forged or corrupt"):
        read_manifest(store)


def test_parquet_row_groups_beyond_the_bytes_are_refused(store):
    doc = parquet_manifest().to_json()
    doc["shards"]["num_bytes"][0] = 8
    doc["num_bytes"] = 8
    _write_doc(store, doc)
    with pytest.raises(ManifestError, match="3 row groups"):
        read_manifest(store)
