"""Our shards read by the tools people already use: webdataset, DALI (CPU), pyarrow; and ShardWriter tars re-sharded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dataio.format.manifest import read_manifest
from dataio.storage.store import Store
from tests.sharding.conftest import run


def _source_samples(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Key -> (image bytes, label), as shardify numbers the sorted files of an image folder."""
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.*"))
    classes = sorted({f.split("/")[0] for f in files})
    return {f"{i:06d}": ((folder / f).read_bytes(), classes.index(f.split("/")[0])) for i, f in enumerate(files)}


@pytest.fixture
def tar_dataset(image_folder: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "tar"
    assert run("write", image_folder, dest, "--shuffle", "--max-samples-per-shard", 7, "--quiet") == 0
    return dest


def _shards(dest: Path) -> list[str]:
    return [str(dest / p) for p in read_manifest(Store(str(dest))).shard_paths]


def test_webdataset_reads_same_keys_and_bytes(tar_dataset: Path, image_folder: Path) -> None:
    import webdataset as wds

    expected = _source_samples(image_folder)
    got = {}
    for s in wds.WebDataset(_shards(tar_dataset), shardshuffle=False):
        got[s["__key__"]] = (s.get("jpg", s.get("png")), int(s["cls"]))
    assert got == expected


def _dali_read(paths: list[str], index_paths: list[str], num_samples: int) -> dict[str, tuple[bytes, int]]:
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=5, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe():  # noqa: ANN202
        image, cls = fn.readers.webdataset(paths=paths, index_paths=index_paths, ext=["jpg;png", "cls"],
                                           missing_component_behavior="error", name="reader")
        return image, cls, fn.get_property(image, key="source_info")

    p = pipe()
    p.build()
    assert p.epoch_size("reader") == num_samples
    out: dict[str, tuple[bytes, int]] = {}
    while len(out) < num_samples:
        images, labels, infos = p.run()
        for i in range(len(images)):
            member = np.array(infos.at(i)).tobytes().decode().rsplit(":", 1)[1]  # ".../shard.tar:OFFSET:KEY.EXT"
            out[member.split(".", 1)[0]] = (np.array(images.at(i)).tobytes(), int(np.array(labels.at(i)).tobytes()))
    return out


@pytest.mark.slow  # runs wds2idx
@pytest.mark.timeout(120)
def test_dali_reads_with_our_index_and_with_wds2idx(tar_dataset: Path, image_folder: Path, tmp_path: Path) -> None:
    pytest.importorskip("nvidia.dali")
    expected = _source_samples(image_folder)
    m = read_manifest(Store(str(tar_dataset)))
    ours = [str(tar_dataset / p) for p in m.index_paths]
    assert _dali_read(_shards(tar_dataset), ours, m.num_samples) == expected
    wds2idx = Path(sys.executable).with_name("wds2idx")
    theirs = []
    for i, shard in enumerate(_shards(tar_dataset)):
        theirs.append(str(tmp_path / f"dali-{i}.idx"))
        subprocess.run([str(wds2idx), shard, theirs[-1]], check=True, capture_output=True, timeout=60)
    assert _dali_read(_shards(tar_dataset), theirs, m.num_samples) == expected


def test_pyarrow_reads_parquet_shards(image_folder: Path, tmp_path: Path) -> None:
    dest = tmp_path / "pq"
    assert run("write", image_folder, dest, "--format", "parquet", "--max-samples-per-shard", 9, "--quiet") == 0
    table = pq.ParquetDataset([str(dest / p) for p in read_manifest(Store(str(dest))).shard_paths]).read()
    got = {r["__key__"]: (r["jpg"] or r["png"], r["cls"]) for r in table.to_pylist()}
    assert got == _source_samples(image_folder)


def test_reshard_webdataset_shardwriter_output(image_folder: Path, tmp_path: Path) -> None:
    import webdataset as wds

    expected = _source_samples(image_folder)
    (tmp_path / "wds").mkdir()
    with wds.ShardWriter(str(tmp_path / "wds" / "part-%03d.tar"), maxcount=10, verbose=0) as sink:
        for key, (data, label) in expected.items():
            sink.write({"__key__": key, "jpg" if data[:2] == b"\xff\xd8" else "png": data, "cls": label})
    dest = tmp_path / "resharded"
    assert run("write", str(tmp_path / "wds" / "part-{000..002}.tar"), dest, "--max-samples-per-shard", 5,
               "--quiet") == 0
    assert run("verify", dest, "--quiet") == 0
    got = {s["__key__"]: (s.get("jpg", s.get("png")), int(s["cls"]))
           for s in wds.WebDataset(_shards(dest), shardshuffle=False)}
    assert got == expected
    # A directory of tars is a source too, and a shardify dataset re-shards keeping its label names.
    assert run("write", tmp_path / "wds", tmp_path / "again", "--format", "parquet", "--quiet") == 0
    assert read_manifest(Store(str(tmp_path / "again"))).num_samples == len(expected)
    assert run("write", image_folder, tmp_path / "named", "--quiet") == 0
    assert run("write", tmp_path / "named", tmp_path / "renamed", "--max-samples-per-shard", 4, "--quiet") == 0
    assert read_manifest(Store(str(tmp_path / "renamed"))).label_names == ("ant", "bee", "cat")
