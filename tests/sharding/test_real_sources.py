"""Sources as they arrive: image folders and tables in object storage (SeaweedFS), Hugging Face-style
Parquet ({bytes, path} image structs, ClassLabel names), provenance sidecars and --key path."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataio import make_loader, sources_of
from dataio.format.manifest import read_manifest
from dataio.storage.store import Store
from sharding.sources.base import path_keys
from tests.dataio.mixed_images import mixed_images
from tests.sharding.conftest import run

pytestmark = pytest.mark.timeout(180)
IMAGES = mixed_images()


def _flags(server) -> list[str]:
    return ["--endpoint-url", server.endpoint_url, "--access-key", server.key, "--secret-key", server.secret,
            "--region", "us-east-1"]


def hf_parquet(path: Path, names: list[str], *, label_names: tuple[str, ...] = ("a", "b"), bytes_field: bool = True,
               row_group_size: int = 100) -> None:
    """What `datasets.Dataset.to_parquet` writes for an Image + ClassLabel + text dataset."""
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())] if bytes_field else [("path", pa.string())])
    images = [({"bytes": IMAGES[n][1], "path": f"{n}.{IMAGES[n][0]}"} if bytes_field else {"path": n}) for n in names]
    table = pa.table({
        "image": pa.array(images, struct),
        "label": pa.array([i % len(label_names) for i in range(len(names))], pa.int64()),
        "caption": pa.array([f"a {n}" for n in names], pa.string()),
    })
    features = {"image": {"_type": "Image"}, "label": {"names": list(label_names), "_type": "ClassLabel"},
                "caption": {"dtype": "string", "_type": "Value"}}
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    pq.write_table(table.replace_schema_metadata(meta), path, row_group_size=row_group_size)


def test_path_keys_are_sanitised_unique_and_stable() -> None:
    rels = ["cat/img 1.v2.jpg", "cat/img_1_v2.png", "dog/ü.jpg", "a//b.JPG"]
    assert path_keys(rels) == ["cat/img_1_v2", "cat/img_1_v2_2", "dog/_", "a/b"]
    assert path_keys(rels) == path_keys(list(rels))


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_hugging_face_parquet_reshards_with_labels_captions_and_provenance(tmp_path, fmt) -> None:
    names = ["jpeg_rgb", "png_rgba", "webp", "png16_grey", "jpeg_cmyk", "gif"]
    hf_parquet(tmp_path / "train.parquet", names)
    dest = tmp_path / "ds"
    assert run("write", tmp_path / "train.parquet", dest, "--format", fmt, "--workers", 1, "--quiet") == 0
    m = read_manifest(Store(str(dest)))
    assert m.label_names == ("a", "b") and {"jpg", "png", "webp", "gif"} <= {f.name for f in m.fields}
    with make_loader(str(dest), batch_size=3, image_size=8, num_workers=0, shuffle=False) as loader:
        batches = list(loader)
        shards = [int(s) for b in batches for s in b["__shard__"]]
        positions = [int(p) for b in batches for p in b["__position__"]]
        origins = sources_of(loader, shards, positions)
    captions = [c for b in batches for c in (b["caption"] if fmt == "parquet" else [j["caption"] for j in b["json"]])]
    assert captions == [f"a {n}" for n in names]
    assert [int(x) for b in batches for x in b["label"]] == [0, 1, 0, 1, 0, 1]
    assert origins == [f"row {i} ({n}.{IMAGES[n][0]})" for i, n in enumerate(names)]
    assert sources_of(str(dest), shards[:1], positions[:1]) == origins[:1]


def test_struct_image_column_without_bytes_is_a_clear_error(tmp_path, capsys) -> None:
    hf_parquet(tmp_path / "t.parquet", ["jpeg_rgb"], bytes_field=False)
    assert run("write", tmp_path / "t.parquet", tmp_path / "ds", "--workers", 1, "--quiet") == 2
    err = capsys.readouterr().err
    assert "'image' is a struct of ['path'] without 'bytes'" in err and "--image-column" in err
    assert not (tmp_path / "ds" / "manifest.json").exists()


@pytest.mark.slow
def test_folder_and_url_table_in_object_storage(s3_server, tmp_path) -> None:
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    expected = {}
    for i, name in enumerate(["jpeg_rgb", "png_rgba", "webp", "png16_rgb", "bmp", "tiff"]):
        rel = f"{'ab'[i % 2]}/{name}.{IMAGES[name][0]}"
        client.put_object(Bucket=bucket, Key=f"raw/{rel}", Body=IMAGES[name][1])
        expected[rel] = name
    src, dest = f"s3://{bucket}/raw/", f"s3://{bucket}/shards"
    assert run("write", src, dest, "--workers", 2, "--quiet", "--key", "path", *_flags(s3_server)) == 0
    store = Store(dest, s3_server.options())
    m = read_manifest(store)
    assert m.num_samples == 6 and m.label_names == ("a", "b")
    with make_loader(dest, batch_size=2, image_size=8, num_workers=0, storage=s3_server.options(),
                     shuffle=False) as loader:
        batches = list(loader)
        origins = sources_of(loader, [s for b in batches for s in b["__shard__"]],
                             [p for b in batches for p in b["__position__"]])
    keys = [k for b in batches for k in b["__key__"]]
    assert sorted(origins) == sorted(expected) and keys == [o.rsplit(".", 1)[0] for o in origins]
    # A local table whose path column holds s3:// URLs, and the same table stored in the bucket.
    table = pa.table({"path": [f"s3://{bucket}/raw/{rel}" for rel in sorted(expected)],
                      "label": [expected[rel] for rel in sorted(expected)]})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    (tmp_path / "urls.parquet").write_bytes(buf.getvalue())
    client.put_object(Bucket=bucket, Key="tables/urls.parquet", Body=buf.getvalue())
    for table_src in (tmp_path / "urls.parquet", f"s3://{bucket}/tables/urls.parquet"):
        out = tmp_path / f"t{len(str(table_src))}"
        assert run("write", table_src, out, "--format", "parquet", "--workers", 1, "--quiet", *_flags(s3_server)) == 0
        with make_loader(str(out), batch_size=3, image_size=8, num_workers=0, shuffle=False) as loader:
            batches = list(loader)
            origins = sources_of(loader, [s for b in batches for s in b["__shard__"]],
                                 [p for b in batches for p in b["__position__"]])
        assert origins == [f"s3://{bucket}/raw/{rel}" for rel in sorted(expected)]
        assert sum(len(b["__key__"]) for b in batches) == 6


@pytest.mark.slow
def test_a_missing_object_is_named_or_a_counted_skip(s3_server, tmp_path, capsys) -> None:
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="raw/a.jpg", Body=IMAGES["jpeg_rgb"][1])
    urls = [f"s3://{bucket}/raw/a.jpg", f"s3://{bucket}/raw/missing.jpg"]
    pq.write_table(pa.table({"path": urls, "label": [0, 1]}), tmp_path / "t.parquet")
    assert run("write", tmp_path / "t.parquet", tmp_path / "ds", "--workers", 1, "--quiet", *_flags(s3_server)) == 2
    err = capsys.readouterr().err
    assert "missing.jpg" in err and "--on-error skip" in err and s3_server.secret not in err
    assert not (tmp_path / "ds" / "manifest.json").exists()
    assert run("write", tmp_path / "t.parquet", tmp_path / "ds2", "--workers", 1, "--quiet", "--on-error", "skip",
               *_flags(s3_server)) == 0
    m = read_manifest(Store(str(tmp_path / "ds2")))
    assert m.num_samples == 1 and len(m.skipped) == 1 and "missing.jpg" in m.skipped[0]["source"]


def test_verify_flags_a_stale_provenance_sidecar(tmp_path, capsys) -> None:
    hf_parquet(tmp_path / "t.parquet", ["jpeg_rgb", "png_rgba"])
    dest = tmp_path / "ds"
    assert run("write", tmp_path / "t.parquet", dest, "--workers", 1, "--quiet") == 0
    assert run("verify", dest, "--quiet", "--workers", 1) == 0
    side = next(dest.glob("shards/*.sources.json"))
    doc = json.loads(side.read_text())
    side.write_text(json.dumps({**doc, "sources": doc["sources"][:1]}))
    assert run("verify", dest, "--quiet", "--workers", 1) == 1
    assert "sources.json" in capsys.readouterr().out


def test_compressed_tar_shards_in_object_storage(s3_server, tmp_path) -> None:
    # .tar.gz WebDataset shards in a bucket: streamed through gzip into a local temporary copy,
    # then read as plain tars; the keys and provenance name the compressed objects.
    import gzip
    import tarfile

    bucket = s3_server.new_bucket()
    client = s3_server.client()
    for j in range(2):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for i, name in enumerate(["jpeg_rgb", "png_rgba"]):
                for ext, data in ((IMAGES[name][0], IMAGES[name][1]), ("cls", str(j).encode())):
                    info = tarfile.TarInfo(f"s{j}-{i}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        client.put_object(Bucket=bucket, Key=f"wds/train-{j:03d}.tar.gz", Body=gzip.compress(buf.getvalue()))
    out = tmp_path / "ds"
    assert run("write", f"s3://{bucket}/wds/", out, "--workers", 2, "--quiet", *_flags(s3_server)) == 0
    with make_loader(str(out), batch_size=2, image_size=8, num_workers=0, shuffle=False) as loader:
        batches = list(loader)
        origins = sources_of(loader, [s for b in batches for s in b["__shard__"]],
                             [p for b in batches for p in b["__position__"]])
    assert sorted(k for b in batches for k in b["__key__"]) == ["s0-0", "s0-1", "s1-0", "s1-1"]
    assert sorted(origins) == [f"train-{j:03d}.tar.gz#s{j}-{i}" for j in range(2) for i in range(2)]
    assert sorted(b["label"].tolist() for b in batches) == [[0, 0], [1, 1]]
