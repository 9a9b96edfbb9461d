"""`shardify write` from image folders, tables and tars: layout, determinism, limits, options."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from dataio.format.manifest import read_manifest
from dataio.format.tar_index import build_index, parse_index
from dataio.storage.store import Store
from sharding.flags import parse_size
from tests.sharding.conftest import CLASSES, manifest_of, run


def _tar_samples(dest: Path) -> dict[str, dict[str, bytes]]:
    """Every sample of every shard of a tar dataset: key -> {ext: bytes}."""
    out: dict[str, dict[str, bytes]] = {}
    for path in read_manifest(Store(str(dest))).shard_paths:
        with tarfile.open(dest / path) as tar:
            for m in tar:
                key, ext = m.name.split(".", 1)
                out.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return out


def test_folder_to_tar_copies_bytes_and_labels(image_folder: Path, tmp_path: Path) -> None:
    dest = tmp_path / "ds"
    assert run("write", image_folder, dest, "--max-samples-per-shard", 5, "--workers", 1, "--quiet") == 0
    m = read_manifest(Store(str(dest)))
    assert m.format == "tar" and m.num_samples == 24 and m.num_shards == 5
    assert m.label_names == CLASSES
    assert {f.name: f.type for f in m.fields} == {"jpg": "image", "png": "image", "cls": "int"}
    files = sorted(p.relative_to(image_folder).as_posix() for p in image_folder.rglob("*.*"))
    samples = _tar_samples(dest)
    for i, rel in enumerate(files):  # keys number the sorted files; bytes copied unchanged
        s = samples[f"{i:06d}"]
        ext = rel.rsplit(".", 1)[1]
        assert s[ext] == (image_folder / rel).read_bytes()
        assert s["cls"] == str(CLASSES.index(rel.split("/")[0])).encode()
    for i in range(m.num_shards):  # each index is the one build_index derives from the tar
        shard = m.shard(i)
        stored = parse_index((dest / shard.index_path).read_bytes())
        assert stored == build_index(open(dest / shard.path, "rb"))
        with tarfile.open(dest / shard.path) as tar:
            assert all(t.mtime == 0 and t.uid == 0 and t.uname == "" for t in tar)


def test_output_is_the_same_for_any_number_of_workers(image_folder: Path, tmp_path: Path) -> None:
    for workers in (1, 2, 3):
        assert run("write", image_folder, tmp_path / f"w{workers}", "--shuffle", "--seed", 7,
                   "--max-samples-per-shard", 4, "--workers", workers, "--quiet") == 0
    one = manifest_of(tmp_path / "w1")["shards"]
    for workers in (2, 3):
        assert manifest_of(tmp_path / f"w{workers}")["shards"] == one
    assert run("write", image_folder, tmp_path / "other", "--shuffle", "--seed", 8,
               "--max-samples-per-shard", 4, "--quiet") == 0
    assert manifest_of(tmp_path / "other")["shards"]["checksum"] != one["checksum"]


def test_shuffle_mixes_classes_across_shards(image_folder: Path, tmp_path: Path) -> None:
    for name, flags in (("plain", ()), ("shuffled", ("--shuffle",))):
        assert run("write", image_folder, tmp_path / name, "--max-samples-per-shard", 8, "--quiet", *flags) == 0
    per_shard = lambda d: [  # noqa: E731
        {s["cls"] for k, s in _tar_samples(d).items() if k in keys} for keys in _keys_per_shard(d)
    ]
    assert all(len(c) == 1 for c in per_shard(tmp_path / "plain"))  # sorted order: one class per shard
    assert any(len(c) > 1 for c in per_shard(tmp_path / "shuffled"))


def _keys_per_shard(dest: Path) -> list[set[str]]:
    m = read_manifest(Store(str(dest)))
    return [{s.key for s in parse_index((dest / m.shard(i).index_path).read_bytes()).samples} for i in range(m.num_shards)]


def test_shard_size_limit(image_folder: Path, tmp_path: Path) -> None:
    assert run("write", image_folder, tmp_path / "ds", "--shard-size", "4KiB", "--quiet") == 0
    m = read_manifest(Store(str(tmp_path / "ds")))
    assert m.num_shards > 3 and m.num_samples == 24
    assert all(n <= 4096 or k == 1 for n, k in zip(m.shard_num_bytes, m.shard_num_samples))


@pytest.mark.parametrize("text,expected", [("256MB", 256_000_000), ("1GiB", 2**30), ("4096", 4096), ("1.5kb", 1500)])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_folder_to_parquet(image_folder: Path, tmp_path: Path) -> None:
    dest = tmp_path / "pq"
    assert run("write", image_folder, dest, "--format", "parquet", "--max-samples-per-shard", 10, "--quiet") == 0
    m = read_manifest(Store(str(dest)))
    assert m.format == "parquet" and m.shard_num_samples == (10, 10, 4) and m.row_groups == ((10,), (10,), (4,))
    table = pq.read_table(dest / m.shard_paths[0])
    assert table.column_names == ["__key__", "jpg", "png", "cls"]
    assert table.schema.field("cls").type == pa.int64()
    row = table.slice(1, 1).to_pylist()[0]
    assert row["__key__"] == "000001" and row["cls"] == 0
    assert row["jpg"] == (tmp_path / "images" / "ant" / "img1.jpg").read_bytes() and row["png"] is None


def test_max_side_downscales(tmp_path: Path) -> None:
    (tmp_path / "src" / "a").mkdir(parents=True)
    Image.new("RGB", (200, 100), (9, 9, 9)).save(tmp_path / "src" / "a" / "big.jpg")
    Image.new("RGB", (20, 10), (9, 9, 9)).save(tmp_path / "src" / "a" / "small.png")
    assert run("write", tmp_path / "src", tmp_path / "ds", "--max-side", 50, "--quiet") == 0
    samples = _tar_samples(tmp_path / "ds")
    assert Image.open(io.BytesIO(samples["000000"]["jpg"])).size == (50, 25)
    assert samples["000001"]["png"] == (tmp_path / "src" / "a" / "small.png").read_bytes()  # small: untouched


def test_table_with_paths_values_and_keys(image_folder: Path, tmp_path: Path) -> None:
    rows = [{"file": f"images/ant/img{i}.jpg", "species": "ant" if i % 2 else "wasp", "id": f"s{i}", "w": i * 0.5}
            for i in (1, 2, 4)]
    table = tmp_path / "t.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dest = tmp_path / "ds"
    assert run("write", table, dest, "--image-column", "file", "--label-column", "species", "--key-column", "id",
               "--quiet") == 0
    m = read_manifest(Store(str(dest)))
    assert m.label_names == ("ant", "wasp")
    samples = _tar_samples(dest)
    assert set(samples) == {"s1", "s2", "s4"}
    assert samples["s1"]["cls"] == b"0" and samples["s2"]["cls"] == b"1"
    assert json.loads(samples["s4"]["json"]) == {"w": 2.0}
    assert samples["s2"]["jpg"] == (image_folder / "ant" / "img2.jpg").read_bytes()


def test_parquet_table_with_image_bytes(image_folder: Path, tmp_path: Path) -> None:
    data = [(image_folder / "bee" / f"img{i}.jpg").read_bytes() for i in (1, 2)]
    pq.write_table(pa.table({"image": data, "label": [3, 5], "caption": ["a", "b"]}), tmp_path / "t.parquet")
    dest = tmp_path / "ds"
    assert run("write", tmp_path / "t.parquet", dest, "--format", "parquet", "--quiet") == 0
    out = pq.read_table(dest / "shards" / "shard-000000.parquet").to_pylist()
    assert [(r["jpg"], r["cls"], r["caption"]) for r in out] == [(data[0], 3, "a"), (data[1], 5, "b")]


def test_on_error_skip_lists_the_sample(image_folder: Path, tmp_path: Path) -> None:
    (image_folder / "bee" / "broken.jpg").write_bytes(b"not a jpeg at all")
    dest = tmp_path / "ds"
    assert run("write", image_folder, dest, "--on-error", "skip", "--quiet") == 0
    m = manifest_of(dest)
    assert m["num_samples"] == 24
    [skipped] = m["skipped"]
    assert skipped["source"].endswith("bee/broken.jpg") and "not a readable image" in skipped["reason"]
    assert run("verify", dest, "--quiet") == 0


def test_overwrite_replaces_the_dataset(image_folder: Path, tmp_path: Path) -> None:
    dest = tmp_path / "ds"
    assert run("write", image_folder, dest, "--max-samples-per-shard", 3, "--quiet") == 0
    old = read_manifest(Store(str(dest)))
    assert run("write", image_folder, dest, "--format", "parquet", "--overwrite", "--quiet") == 0
    m = read_manifest(Store(str(dest)))
    assert m.format == "parquet" and m.shard_paths == ("shards/v000002/shard-000000.parquet",)
    assert all((dest / p).exists() for p in old.shard_paths)  # readers of the old version keep reading
    assert run("gc", dest, "--grace", "0") == 0  # past the grace period, the old version goes
    names = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert [n for n in names if not n.startswith("versions/v000002/")] == [
        "manifest.json", "shards/v000002/shard-000000.parquet", "shards/v000002/shard-000000.sources.json"]


def test_overwrite_refuses_to_delete_foreign_files(image_folder: Path, tmp_path: Path, capsys) -> None:
    dest = tmp_path / "ds"
    dest.mkdir()
    (dest / "thesis.tex").write_text("precious")
    assert run("write", image_folder, dest, "--overwrite", "--quiet") == 2
    assert "thesis.tex" in capsys.readouterr().err and (dest / "thesis.tex").exists()


@pytest.mark.parametrize("name,size", [("000001.jpg", 0), ("a/b.json", 12345), ("x" * 100, 5), ("y.j", 8**11 - 1),
                                       ("d/" * 60 + "a.cls", 3), ("ü.jpg", 7)])
def test_fast_tar_header_is_tarfiles(name: str, size: int) -> None:
    from sharding.write.tar import _tarfile_header, member_header

    assert member_header(name, size) == _tarfile_header(name, size)


def test_unusable_keys_are_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "t.csv").write_text("path,id\na.jpg,x.1\n")
    assert run("write", tmp_path / "t.csv", tmp_path / "ds", "--key-column", "id") == 2
    assert "'x.1'" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_spawned_workers_write_the_same_shards(image_folder: Path, tmp_path: Path, monkeypatch) -> None:
    """Workers also run under `spawn` (what platforms without fork use): everything they get pickles."""
    import multiprocessing as mp

    import sharding.write.parallel

    flags = ("--shuffle", "--max-samples-per-shard", 6, "--workers", 2, "--quiet")
    assert run("write", image_folder, tmp_path / "fork", *flags) == 0
    monkeypatch.setattr(sharding.write.parallel, "_mp_context", lambda: mp.get_context("spawn"))
    assert run("write", image_folder, tmp_path / "spawn", *flags) == 0
    assert manifest_of(tmp_path / "spawn")["shards"] == manifest_of(tmp_path / "fork")["shards"]
