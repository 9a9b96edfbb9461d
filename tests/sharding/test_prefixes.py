"""Shards spread over hashed prefixes (`--prefixes`), with a parted manifest: every reader still finds them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from dataio import make_loader
from dataio.format.manifest import read_manifest
from dataio.storage.store import Store
from sharding.write.plan import default_prefixes, shard_name
from tests.sharding.conftest import run


def test_default_prefixes_grow_with_the_shard_count() -> None:
    assert [default_prefixes(n) for n in (1, 10_000, 10_001, 100_000, 2_000_000, 10**9)] == [1, 1, 2, 16, 256, 1024]


def test_shard_names_hash_the_number_into_a_prefix() -> None:
    assert shard_name(7, 100, "tar") == "shards/shard-000007.tar"
    names = [shard_name(i, 4096, "tar", 256) for i in range(4096)]
    prefixes = {n.split("/")[1] for n in names}
    assert all(len(p) == 2 for p in prefixes) and len(prefixes) > 200  # consecutive shards spread out
    assert names == [shard_name(i, 4096, "tar", 256) for i in range(4096)]  # fixed by the number alone
    assert shard_name(3, 10, "parquet", 4096).split("/")[1].__len__() == 3


def test_prefixed_layout_local(image_folder: Path, tmp_path: Path, capsys) -> None:
    plain, spread = tmp_path / "plain", tmp_path / "spread"
    common = ("--max-samples-per-shard", 3, "--shuffle", "--quiet", "--workers", 1)
    assert run("write", image_folder, plain, *common) == 0
    assert run("write", image_folder, spread, *common, "--prefixes", 4, "--manifest-parts-above", 2) == 0
    a, b = read_manifest(Store(str(plain))), read_manifest(Store(str(spread)))
    assert b.parted is not None and a.parted is None
    assert list(a.shard_checksums) == list(b.shard_checksums)  # the same bytes, placed elsewhere
    assert len({p.split("/")[1] for p in b.shard_paths}) > 1
    assert all(p.count("/") == 2 and (spread / p).is_file() for p in b.shard_paths)
    assert run("verify", spread, "--quiet") == 0
    urls = tmp_path / "urls.txt"
    assert run("inspect", spread, "--urls", urls) == 0
    listed = urls.read_text().splitlines()
    assert listed == [f"{spread}/{p}" for p in b.shard_paths]
    import webdataset as wds

    keys = [s["__key__"] for s in wds.WebDataset(listed, shardshuffle=False)]
    assert sorted(keys) == sorted(f"{i:06d}" for i in range(24))
    if importlib.util.find_spec("nvidia.dali") is not None:  # DALI's reader takes the same list (and our indexes)
        from tests.sharding.test_interop import _dali_read, _source_samples

        index_urls = [u.rsplit(".", 1)[0] + ".idx" for u in listed]
        assert _dali_read(listed, index_urls, 24) == _source_samples(image_folder)
    assert run("inspect", spread, "--no-labels") == 0
    assert "Parquet parts" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_prefixed_parted_dataset_on_s3(s3_server, image_folder: Path, tmp_path: Path) -> None:
    url = f"s3://{s3_server.new_bucket()}/ds"
    flags = ["--endpoint-url", s3_server.endpoint_url, "--access-key", s3_server.key, "--secret-key",
             s3_server.secret, "--region", "us-east-1"]
    assert run("write", image_folder, url, "--max-samples-per-shard", 2, "--prefixes", 4, "--manifest-parts-above", 4,
               "--workers", 2, "--quiet", *flags) == 0
    store = Store(url, s3_server.options())
    manifest = read_manifest(store)
    assert manifest.num_shards == 12 and manifest.parted is not None
    objects = set(store.list())
    assert set(manifest.shard_paths) <= objects and set(manifest.part_paths) <= objects
    assert {p.split("/")[1] for p in manifest.shard_paths} == {"00", "01", "02", "03"}
    assert run("verify", url, "--quiet", *flags) == 0
    assert run("inspect", url, "--urls", tmp_path / "urls.txt", *flags) == 0
    assert len((tmp_path / "urls.txt").read_text().splitlines()) == 12
    with make_loader(url, batch_size=4, num_workers=2, decode=None, storage=s3_server.options(), tail="pad") as loader:
        keys = [k for b in loader for k, m in zip(b["__key__"], b["mask"].tolist()) if m]
    assert sorted(keys) == sorted(f"{i:06d}" for i in range(24))


def test_gc_removes_a_retired_versions_parts_and_keeps_the_current_ones(image_folder: Path, tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    common = ("--max-samples-per-shard", 3, "--prefixes", 4, "--manifest-parts-above", 2, "--quiet", "--workers", 1)
    assert run("write", image_folder, ds, *common, "--shuffle", "--seed", 1) == 0
    old = read_manifest(Store(str(ds)))
    assert run("write", image_folder, ds, *common, "--shuffle", "--seed", 2, "--overwrite") == 0
    new = read_manifest(Store(str(ds)))
    assert old.fingerprint != new.fingerprint and all((ds / p).is_file() for p in old.part_paths)
    assert run("gc", ds, "--grace", "0") == 0
    assert not any((ds / p).exists() for p in old.part_paths)  # the retired version's parts went with it
    assert all((ds / p).is_file() for p in new.part_paths)
    assert run("verify", ds, "--quiet") == 0


def test_append_to_a_parted_prefixed_dataset(image_folder: Path, tmp_path: Path) -> None:
    from tests.sharding.conftest import make_image_folder

    ds, more = tmp_path / "ds", make_image_folder(tmp_path / "more", seed=5, per_class=2)
    common = ("--max-samples-per-shard", 3, "--quiet", "--workers", 1)
    assert run("write", image_folder, ds, *common, "--prefixes", 4, "--manifest-parts-above", 2) == 0
    old = read_manifest(Store(str(ds)))
    assert run("append", more, ds, *common) == 0
    new = read_manifest(Store(str(ds)))
    assert new.num_samples == 30 and new.num_shards == old.num_shards + 2  # 10 shards: one JSON file again
    assert list(new.shard_paths)[: old.num_shards] == list(old.shard_paths)
    assert run("verify", ds, "--quiet") == 0
