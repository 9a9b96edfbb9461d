"""`shardify inspect` shows what a dataset holds; `shardify verify` finds every kind of damage."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dataio.format.manifest import read_manifest
from dataio.format.tar_index import parse_index
from dataio.storage.store import Store
from tests.sharding.conftest import run


@pytest.fixture
def dataset(image_folder: Path, tmp_path: Path, request) -> Path:
    fmt = getattr(request, "param", "tar")
    (image_folder / "bee" / "broken.jpg").write_bytes(b"\xff\xd8 nope")
    dest = tmp_path / "ds"
    assert run("write", image_folder, dest, "--format", fmt, "--on-error", "skip", "--max-samples-per-shard", 10,
               "--quiet") == 0
    return dest


@pytest.mark.parametrize("dataset", ["tar", "parquet"], indirect=True)
def test_inspect_shows_shards_fields_labels_and_skipped(dataset: Path, capsys) -> None:
    assert run("inspect", dataset) == 0
    out = capsys.readouterr().out
    fmt = read_manifest(Store(str(dataset))).format
    for text in (fmt, "shards (3)", "shard-000002", "jpg:image", "cls:int", "label histogram", "ant", "bee",
                 "cat", "33.3%", "skipped samples (1)", "broken.jpg"):
        assert text in out, text


@pytest.mark.slow  # runs the CLI in a new interpreter
def test_inspect_piped_shows_every_shard_path_whole_and_every_column(dataset: Path) -> None:
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "80"}  # a narrow terminal's width must not squeeze a piped table
    out = subprocess.run([sys.executable, "-m", "sharding.cli", "inspect", str(dataset)], capture_output=True,
                         text=True, timeout=120, env=env).stdout
    m = read_manifest(Store(str(dataset)))
    for i in range(m.num_shards):
        row = next(line for line in out.splitlines() if m.shard(i).path in line)  # the whole path, on one line
        assert m.shard(i).index_path in row and f" {m.shard(i).num_samples} " in row and m.shard(i).checksum in row
    assert "samples" in out and "bytes" in out


@pytest.mark.parametrize("dataset", ["tar", "parquet"], indirect=True)
def test_verify_passes_on_a_fresh_dataset(dataset: Path, capsys) -> None:
    assert run("verify", dataset, "--workers", 2) == 0
    assert "OK: 3 shards, 24 samples" in capsys.readouterr().out


def _first_image(dataset: Path) -> tuple[Path, str, int, int]:
    m = read_manifest(Store(str(dataset)))
    shard = m.shard(1)
    sample = parse_index((dataset / shard.index_path).read_bytes()).samples[2]
    image = sample.members[0]
    return dataset / shard.path, sample.key, image.offset, image.size


def test_verify_names_shard_and_sample_of_a_damaged_image(dataset: Path, capsys) -> None:
    path, key, offset, size = _first_image(dataset)
    data = bytearray(path.read_bytes())
    data[offset : offset + size] = b"\x00" * size  # same size, image destroyed
    path.write_bytes(bytes(data))
    assert run("verify", dataset) == 1
    out = capsys.readouterr().out
    assert f"{path}: checksum" in out
    assert f"{path} sample {key!r}" in out


def test_verify_finds_truncated_shard_and_wrong_index(dataset: Path, capsys) -> None:
    m = read_manifest(Store(str(dataset)))
    shard0, shard2 = dataset / m.shard_paths[0], m.shard(2)
    shard0.write_bytes(shard0.read_bytes()[:3000])
    idx = dataset / shard2.index_path
    idx.write_bytes(idx.read_bytes().replace(b"cls ", b"cls 1", 1))
    assert run("verify", dataset) == 1
    out = capsys.readouterr().out
    assert f"{shard0}: size 3000 bytes, manifest says" in out
    assert f"{idx}: size" in out and "do not match the index" in out


@pytest.mark.parametrize("dataset", ["parquet"], indirect=True)
def test_verify_finds_damaged_parquet(dataset: Path, capsys) -> None:
    path = dataset / read_manifest(Store(str(dataset))).shard_paths[1]
    path.write_bytes(b"PAR1" + bytes(100))
    assert run("verify", dataset) == 1
    out = capsys.readouterr().out
    assert f"{path}: size 104 bytes" in out and "not a readable Parquet file" in out


def test_verify_reports_missing_shard(dataset: Path, capsys) -> None:
    path = dataset / read_manifest(Store(str(dataset))).shard_paths[2]
    path.unlink()
    assert run("verify", dataset) == 1
    out = capsys.readouterr().out
    assert f"{path}: cannot read" in out and "FileNotFoundError" in out
