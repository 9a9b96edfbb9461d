"""Checksums at read granularity as shardify writes and checks them (issue 9): `shardify write` and
`shardify index` record them (manifest version 3), `shardify verify` names the changed sample or
row group, and `shardify append` onto a dataset written before keeps its old shards readable."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dataio import ShardFormatError, UnverifiedDataWarning, make_loader
from dataio.format.checksums import chunk_span, parse_sums, sample_sums, sums_path
from dataio.format.manifest import MANIFEST_VERSION, read_manifest
from dataio.format.tar_index import parse_index
from dataio.storage.store import Store
from tests.dataio.test_checksums import LEGACY, flip_byte
from tests.sharding.conftest import make_image_folder, manifest_of, run
from tests.sharding.test_index import hf_export  # noqa: F401 - a fixture


def _epoch(url: Path, **kw) -> list[str]:
    loader = make_loader(str(url), batch_size=2, num_workers=0, decode=None, shuffle=False, tail="pad", **kw)
    loader.set_epoch(0)
    return [k for b in loader for k in b["__key__"]]


def test_write_records_per_sample_checksums_and_verify_names_the_changed_sample(image_folder, tmp_path, capsys):
    ds = tmp_path / "ds"
    assert run("write", image_folder, ds, "--max-samples-per-shard", 8, "--workers", 1, "--quiet") == 0
    doc = manifest_of(ds)
    assert doc["shardify_manifest"] == MANIFEST_VERSION and len(doc["shards"]["sums_checksum"]) == 3
    shard = ds / doc["shards"]["path"][1]
    index = parse_index((ds / doc["shards"]["index_path"][1]).read_bytes())
    sums = parse_sums((ds / sums_path(doc["shards"]["path"][1])).read_bytes(), num_samples=len(index), url="x")
    assert sums == sample_sums(shard.read_bytes(), index.samples)  # what the writer computed as it wrote
    assert run("verify", ds, "--quiet", "--workers", 1) == 0
    assert "every sample's" in capsys.readouterr().out
    assert run("inspect", ds, "--no-labels") == 0
    assert "version 3" in (out := capsys.readouterr().out) and "per sample" in out
    member = index.samples[5].members[0]
    flip_byte(str(shard), member.offset + member.size // 2)
    assert run("verify", ds, "--quiet", "--workers", 1) == 1
    out = capsys.readouterr().out
    assert f"sample {index.samples[5].key!r}: its bytes do not match its checksum" in out
    with pytest.raises(ShardFormatError, match=repr(index.samples[5].key)):
        _epoch(ds)  # verify_checksums is on by default


def test_parquet_write_records_row_group_checksums(image_folder, tmp_path, capsys):
    ds = tmp_path / "ds"
    assert run("write", image_folder, ds, "--format", "parquet", "--max-samples-per-shard", 12, "--workers", 1,
               "--quiet") == 0
    doc = manifest_of(ds)
    assert doc["shardify_manifest"] == MANIFEST_VERSION
    assert [len(c) for c in doc["shards"]["row_group_checksums"]] == [len(r) for r in doc["shards"]["row_groups"]]
    assert len(_epoch(ds)) == 24
    path = ds / doc["shards"]["path"][0]
    rg = pq.ParquetFile(path).metadata.row_group(0)
    a, b = chunk_span(next(rg.column(i) for i in range(rg.num_columns) if rg.column(i).path_in_schema == "jpg"))
    flip_byte(str(path), b - 5)  # uncompressed image bytes: decodes, silently different
    assert run("verify", ds, "--quiet", "--workers", 1) == 1
    out = capsys.readouterr().out
    assert "row group 0 (rows 0-" in out and "its column chunks do not match" in out
    with pytest.raises(ShardFormatError, match=r"row group 0 .*column 'jpg'"):
        _epoch(ds)


def test_index_records_row_group_checksums(hf_export):  # noqa: F811 - the fixture
    assert run("index", hf_export) == 0
    m = read_manifest(Store(str(hf_export)))
    assert m.has_read_checksums and [len(c) for c in m.row_group_checksums] == [len(r) for r in m.row_groups]
    assert len(_epoch(hf_export)) == m.num_samples
    path = hf_export / m.shard_paths[0]
    rg = pq.ParquetFile(path).metadata.row_group(1)
    a, b = chunk_span(next(rg.column(i) for i in range(rg.num_columns) if rg.column(i).path_in_schema == "label"))
    flip_byte(str(path), b - 2)
    with pytest.raises(ShardFormatError, match="row group 1"):
        _epoch(hf_export)


@pytest.mark.parametrize("name", ["tar", "parquet"])
def test_append_to_a_dataset_written_before(tmp_path, name):
    """The old shards stay readable (unchecked), the appended ones carry checksums; no note then."""
    ds = shutil.copytree(LEGACY / name, tmp_path / "ds")
    more = make_image_folder(tmp_path / "more", per_class=2, classes=("ant", "bee"), size=8, seed=3)
    assert run("append", more, ds, "--max-samples-per-shard", 2, "--workers", 1, "--quiet") == 0
    doc = json.loads((ds / "manifest.json").read_text())
    column = doc["shards"]["sums_checksum" if name == "tar" else "row_group_checksums"]
    assert doc["shardify_manifest"] == MANIFEST_VERSION and len(column) == 4
    assert not any(column[:2]) and all(column[2:])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnverifiedDataWarning)
        assert len(_epoch(ds)) == 8
    assert run("verify", ds, "--quiet", "--workers", 1) == 0


def test_legacy_verify_says_it_is_unchecked_per_sample(tmp_path, capsys):
    ds = shutil.copytree(LEGACY / "tar", tmp_path / "ds")
    assert run("verify", ds, "--quiet", "--workers", 1) == 0
    assert "manifest version 1, written before them" in capsys.readouterr().out
    assert run("inspect", ds, "--no-labels") == 0
    out = capsys.readouterr().out
    assert "version 1" in out and "sizes only" in out


def test_stock_readers_ignore_the_sidecar(image_folder: Path, tmp_path: Path):
    """webdataset reads the shard alone; the sidecar is a file beside it, like the index."""
    import webdataset as wds

    ds = tmp_path / "ds"
    assert run("write", image_folder, ds, "--max-samples-per-shard", 30, "--workers", 1, "--quiet") == 0
    shard = ds / manifest_of(ds)["shards"]["path"][0]
    assert (ds / sums_path(manifest_of(ds)["shards"]["path"][0])).exists()
    assert len(list(wds.WebDataset(str(shard), shardshuffle=False))) == 24


def test_parquet_pages_carry_crcs_and_slices_check_them(image_folder, tmp_path):
    """`shardify write --format parquet` puts a CRC-32 on every page, so a loader reading row groups in
    slices (a window smaller than a group) checks each page before decoding it: no VerifyCostWarning,
    and a changed page fails naming it (tests/dataio/test_page_checksums.py has the details)."""
    from dataio import VerifyCostWarning
    from tests.dataio.test_page_checksums import pages_of

    ds = tmp_path / "ds"
    assert run("write", image_folder, ds, "--format", "parquet", "--max-samples-per-shard", 12, "--workers", 1,
               "--quiet") == 0
    path = ds / manifest_of(ds)["shards"]["path"][0]
    pages = pages_of(path.read_bytes(), "jpg")
    assert pages and all(crc is not None for *_, crc in pages)
    with warnings.catch_warnings():
        warnings.simplefilter("error", VerifyCostWarning)
        assert len(_epoch(ds, shuffle_window_bytes=2000)) == 24
    _, end, _, _ = pages[0]
    flip_byte(str(path), end - 5)
    with pytest.raises(ShardFormatError, match=r"row group 0 \(rows 0-11, read in slices\), column 'jpg', page 0"):
        _epoch(ds, shuffle_window_bytes=2000)
