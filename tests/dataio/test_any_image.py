"""Any image format per sample and every field through: the CPU decoder, DALI's per-sample fallback,
the loader's per-sample image choice, and non-image fields in the batch."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
import torch

from dataio import make_loader
from dataio.batch import PackedBytes
from dataio.decode.cpu import CpuDecoder, DecodeConfig
from dataio.decode.images import IMAGE_FIELD_ORDER, order_image_fields
from dataio.errors import CorruptSampleError
from dataio.format.manifest import Field, Manifest, checksum_bytes, write_manifest
from dataio.format.tar_index import build_index
from dataio.storage.store import Store
from tests.dataio.mixed_images import mixed_images

pytestmark = pytest.mark.timeout(120)
IMAGES = mixed_images()


def mean_rgb(chw: np.ndarray | torch.Tensor) -> list[int]:
    arr = np.asarray(chw, dtype=np.float64).reshape(3, -1)
    return arr.mean(axis=1).round().astype(int).tolist()


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_every_format_and_mode_comes_out_rgb_uint8(name) -> None:
    _, data, expected, tolerance = IMAGES[name]
    for decoder in ("auto", "pil"):
        out = CpuDecoder(DecodeConfig(size=8, train=False, decoder=decoder)).decode(data, seed=0)
        assert out.shape == (3, 8, 8) and out.dtype == np.uint8
        assert max(abs(a - b) for a, b in zip(mean_rgb(out), expected)) <= tolerance, (name, mean_rgb(out), expected)


def test_alpha_is_composited_on_black() -> None:
    from PIL import Image

    img = Image.new("RGBA", (8, 8), (255, 255, 255, 0))  # fully transparent white
    buf = io.BytesIO()
    img.save(buf, "PNG")
    out = CpuDecoder(DecodeConfig(size=8, train=False)).decode(buf.getvalue(), seed=0)
    assert int(out.max()) == 0


def test_image_field_order_is_documented_and_total() -> None:
    assert IMAGE_FIELD_ORDER[:3] == ("jpg", "jpeg", "png")
    assert order_image_fields(["image", "png", "jpg"]) == ("jpg", "png", "image")


def write_members(store: Store, shards: list[list[tuple[str, list[tuple[str, bytes]]]]], fields: tuple[Field, ...]) -> None:
    """Publish tar shards of (key, [(ext, bytes)]) samples with indexes and a manifest."""
    cols: dict[str, list] = {k: [] for k in ("path", "n", "size", "sum", "ipath", "isize", "isum")}
    for i, samples in enumerate(shards):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for key, members in samples:
                for ext, data in members:
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        data = buf.getvalue()
        index = build_index(io.BytesIO(data)).dumps()
        rel = f"shards/shard-{i:06d}.tar"
        store.write_bytes(rel, data)
        store.write_bytes(rel[:-4] + ".idx", index)
        for k, v in (("path", rel), ("n", len(samples)), ("size", len(data)), ("sum", checksum_bytes(data)),
                     ("ipath", rel[:-4] + ".idx"), ("isize", len(index)), ("isum", checksum_bytes(index))):
            cols[k].append(v)
    write_manifest(store, Manifest(
        format="tar", fields=fields, shard_paths=tuple(cols["path"]), shard_num_samples=tuple(cols["n"]),
        shard_num_bytes=tuple(cols["size"]), shard_checksums=tuple(cols["sum"]), index_paths=tuple(cols["ipath"]),
        index_num_bytes=tuple(cols["isize"]), index_checksums=tuple(cols["isum"]),
    ))


def one_epoch(url: str, **kw) -> list[dict]:
    kw.setdefault("num_workers", 0)
    kw.setdefault("shuffle", False)
    with make_loader(url, **kw) as loader:
        return list(loader)


def test_each_sample_decodes_its_own_image_field_in_the_documented_order(tmp_path) -> None:
    jpg, png, webp = (IMAGES[n][1] for n in ("jpeg_rgb", "png_rgba", "webp"))
    samples = [("a", [("jpg", jpg), ("cls", b"0")]), ("b", [("png", png), ("cls", b"1")]),
               ("c", [("webp", webp), ("cls", b"2")]), ("d", [("png", png), ("jpg", jpg), ("cls", b"3")])]
    store = Store(str(tmp_path / "ds"))
    fields = (Field(name="jpg", type="image"), Field(name="png", type="image"), Field(name="webp", type="image"),
              Field(name="cls", type="int"))
    write_members(store, [samples], fields)
    (batch,) = one_epoch(store.raw_url, batch_size=4, image_size=8, train=False)
    got = {k: mean_rgb(img) for k, img in zip(batch["__key__"], batch["image"])}
    assert got["b"] == [100, 50, 25] and got["c"] == [200, 100, 50]
    assert got["d"] == got["a"]  # jpg comes before png in IMAGE_FIELD_ORDER
    assert batch["label"].tolist() == [0, 1, 2, 3] and not any(f in batch for f in ("jpg", "png", "webp"))
    (raw,) = one_epoch(store.raw_url, batch_size=4, decode=None)
    assert isinstance(raw["png"], PackedBytes) and raw["png"].to_list() == [b"", png, b"", png]  # absent: empty


def test_a_sample_without_an_image_names_its_key_or_is_a_counted_skip(tmp_path) -> None:
    jpg = IMAGES["jpeg_rgb"][1]
    samples = [("a", [("jpg", jpg)]), ("nothing", [("txt", b"hi")]), ("c", [("jpg", jpg)]), ("d", [("jpg", jpg)])]
    store = Store(str(tmp_path / "ds"))
    write_members(store, [samples], (Field(name="jpg", type="image"), Field(name="txt", type="bytes")))
    with pytest.raises(CorruptSampleError, match=r"sample 'nothing' has no image.*on_corrupt='skip'"):
        one_epoch(store.raw_url, batch_size=4, image_size=8)
    with make_loader(store.raw_url, batch_size=4, image_size=8, num_workers=0, on_corrupt="skip") as loader:
        (batch,) = list(loader)
        assert loader.stats.corrupt_skipped == 1 and loader.stats.corrupt_keys[0].endswith("#nothing")
    assert batch["mask"].sum() == 3 and "nothing" not in batch["__key__"]  # replaced by a good one, masked


def test_every_field_reaches_the_batch(tmp_path) -> None:
    jpg = IMAGES["jpeg_rgb"][1]
    npy = io.BytesIO()
    np.save(npy, np.arange(3, dtype=np.int16), allow_pickle=False)
    samples = [(f"k{i}", [("jpg", jpg), ("cls", str(i).encode()), ("txt", f"caption {i} é".encode()),
                          ("json", json.dumps({"i": i, "tags": ["x"]}).encode()), ("npy", npy.getvalue()),
                          ("cls2", str(i * 10).encode()), ("bin", bytes([i]))]) for i in range(4)]
    store = Store(str(tmp_path / "ds"))
    fields = (Field(name="jpg", type="image"), Field(name="cls", type="int"), Field(name="txt", type="bytes"),
              Field(name="json", type="json"), Field(name="npy", type="npy"), Field(name="cls2", type="bytes"),
              Field(name="bin", type="bytes"))
    write_members(store, [samples], fields)
    for decode in ("cpu", None):
        (batch,) = one_epoch(store.raw_url, batch_size=4, image_size=8, decode=decode)
        assert batch["txt"] == [f"caption {i} é" for i in range(4)]
        assert batch["json"] == [{"i": i, "tags": ["x"]} for i in range(4)]
        assert batch["cls2"].dtype == torch.int64 and batch["cls2"].tolist() == [0, 10, 20, 30]
        assert isinstance(batch["npy"], PackedBytes)
        assert np.load(io.BytesIO(batch["npy"][2]), allow_pickle=False).tolist() == [0, 1, 2]
        assert batch["bin"].to_list() == [bytes([i]) for i in range(4)]
        assert batch["__shard__"].tolist() == [0] * 4 and batch["__position__"].tolist() == [0, 1, 2, 3]
    (batch,) = one_epoch(store.raw_url, batch_size=4, decode=None, fields=("txt",))
    assert set(batch) >= {"txt", "label"} and "json" not in batch and "jpg" not in batch


def test_bad_json_names_the_key_or_is_skipped(tmp_path) -> None:
    jpg = IMAGES["jpeg_rgb"][1]
    samples = [(f"k{i}", [("jpg", jpg), ("json", b"{not json" if i == 1 else b"{}")]) for i in range(4)]
    store = Store(str(tmp_path / "ds"))
    write_members(store, [samples], (Field(name="jpg", type="image"), Field(name="json", type="json")))
    with pytest.raises(CorruptSampleError, match=r"sample 'k1': field 'json' is not valid JSON"):
        one_epoch(store.raw_url, batch_size=4, image_size=8)
    for decode in ("cpu", None):
        (batch,) = one_epoch(store.raw_url, batch_size=4, image_size=8, decode=decode, on_corrupt="skip")
        assert batch["mask"].sum() == 3 and "k1" not in batch["__key__"] and batch["json"] == [{}] * 4


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_batch_carries_every_field_even_when_its_samples_lack_it(tmp_path, num_workers) -> None:
    # A field only some samples hold was missing from the batches whose samples all lacked it:
    # batch["json"] raised KeyError mid-epoch (tar and Parquet, RAW and decoded, alike).
    jpg, png = IMAGES["jpeg_rgb"][1], IMAGES["png_rgba"][1]
    samples = [(f"k{i}", [("jpg" if i % 4 else "png", jpg if i % 4 else png), ("cls", b"1")]
                + ([("json", b'{"i": 0}')] if i == 0 else [])) for i in range(8)]
    store = Store(str(tmp_path / "ds"))
    write_members(store, [samples], (Field(name="jpg", type="image"), Field(name="png", type="image"),
                                     Field(name="cls", type="int"), Field(name="json", type="json")))
    for decode in (None, "cpu", "dali"):
        batches = one_epoch(store.raw_url, batch_size=2, image_size=8, decode=decode, num_workers=num_workers)
        assert len(batches) == 4
        for batch in batches:
            assert batch["json"] == ([{"i": 0}, None] if "k0" in batch["__key__"] else [None, None])
            if decode is None:
                assert isinstance(batch["jpg"], PackedBytes) and isinstance(batch["png"], PackedBytes)
                assert batch["png"].to_list() == [png if k in ("k0", "k4") else b"" for k in batch["__key__"]]
