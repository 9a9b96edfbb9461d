"""Per-sample buffers of PackedBytes: zero-copy views of the shards' bytes, what takes them, their lifetime."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from dataio import make_loader
from dataio.batch import PackedBytes, ViewGuard
from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset

SIZES = [7, 5, 9]


@pytest.fixture
def images(tmp_path) -> tuple[str, dict[str, bytes]]:
    """A dataset of real JPEGs and every sample's bytes by key, as written into the shards."""
    store = Store(str(tmp_path / "ds"))
    _, shards = write_tar_dataset(store, SIZES, real_images=True)
    return store.raw_url, {s["__key__"]: s["jpg"] for shard in shards for s in shard}


def _loader(url: str, **options):
    return make_loader(url, batch_size=4, seed=0, rank=0, world_size=1, decode=None, tail="pad", **options)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_views_are_the_shards_bytes_without_a_copy(images, num_workers) -> None:
    url, by_key = images
    seen = 0
    for batch in _loader(url, num_workers=num_workers):
        packed = batch["jpg"]
        views = list(packed)  # iterating yields the same views as views()
        assert all(isinstance(v, memoryview) for v in views)
        assert [bytes(v) for v in views] == [by_key[k] for k in batch["__key__"]] == packed.to_list()
        whole = packed.data.numpy()
        assert all(np.shares_memory(np.asarray(v), whole) for v in views if len(v))  # no copy
        seen += len(views)
    assert seen >= sum(SIZES)


def test_pil_simplejpeg_and_bytes_take_a_view(images) -> None:
    url, by_key = images
    batch = next(iter(_loader(url, num_workers=0)))
    for key, view in zip(batch["__key__"], batch["jpg"].views()):
        expected = np.asarray(Image.open(io.BytesIO(by_key[key])).convert("RGB"))
        with Image.open(io.BytesIO(view)) as img:
            assert np.array_equal(np.asarray(img.convert("RGB")), expected)
        assert simplejpeg.decode_jpeg(view).shape == expected.shape
        assert bytes(view) == by_key[key]


def test_dali_external_source_takes_views(images) -> None:
    dali = pytest.importorskip("nvidia.dali")
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    url, by_key = images
    batch = next(iter(_loader(url, num_workers=0)))
    views = batch["jpg"].views()

    @dali.pipeline_def(batch_size=len(views), num_threads=1, device_id=None)  # CPU only
    def pipe():
        return fn.decoders.image(fn.external_source(source=lambda: views, dtype=types.UINT8), device="cpu")

    p = pipe()
    p.build()
    (out,) = p.run()
    for i, key in enumerate(batch["__key__"]):
        expected = np.asarray(Image.open(io.BytesIO(by_key[key])).convert("RGB"))
        assert np.asarray(out.at(i)).shape == expected.shape


def test_to_list_copies_every_item_and_empty_ones() -> None:
    packed = PackedBytes.pack([b"ab", b"", b"cde"])
    items = packed.to_list()
    assert items == [b"ab", b"", b"cde"] and all(type(b) is bytes for b in items)
    packed.data[0] = ord("z")  # copies: later writes to the batch do not reach them
    assert items[0] == b"ab" and bytes(packed.views()[0]) == b"zb"
    assert PackedBytes.pack([]).views() == [] and PackedBytes.pack([]).to_list() == []


@pytest.mark.parametrize("num_workers", [0, 2])
def test_views_of_a_reused_slab_fail_once_the_caller_moves_on(images, num_workers) -> None:
    url, by_key = images
    it = iter(_loader(url, num_workers=num_workers, reuse_buffers=True))
    first = next(it)
    views = first["jpg"].views()
    assert [bytes(v) for v in views] == [by_key[k] for k in first["__key__"]]
    second = next(it)  # the caller asks for the next batch: the first one's slab may be rewritten
    for view in views:
        with pytest.raises(ValueError, match="released"):
            bytes(view)
    with pytest.raises(ValueError, match="reuse_buffers"):
        first["jpg"].views()
    assert [bytes(v) for v in second["jpg"]] == [by_key[k] for k in second["__key__"]]
    views = second["jpg"].views()
    iter(_loader(url, num_workers=0))  # another loader's iteration changes nothing here
    assert bytes(views[0]) == by_key[second["__key__"][0]]


def test_a_new_iteration_releases_the_last_batchs_views(images) -> None:
    url, _ = images
    loader = _loader(url, num_workers=0, reuse_buffers=True)
    views = next(iter(loader))["jpg"].views()
    assert len(bytes(views[0])) > 0  # the abandoned iteration's batch stays readable until a new one
    iter(loader)
    with pytest.raises(ValueError):
        bytes(views[0])


def test_without_reuse_views_live_as_long_as_the_batch(images) -> None:
    url, by_key = images
    kept = [(b["__key__"], b["jpg"].views()) for b in _loader(url, num_workers=2)]
    for keys, views in kept:
        assert [bytes(v) for v in views] == [by_key[k] for k in keys]


def test_what_is_derived_from_a_view_is_not_guarded_and_a_guarded_batch_pickles() -> None:
    guard = ViewGuard()
    packed = guard.attach({"jpg": PackedBytes.pack([b"abc", b"de"])})["jpg"]
    views = packed.views()
    held = np.frombuffer(views[1], dtype=np.uint8)  # numpy takes its own view of the memory
    assert guard.release() == 0
    with pytest.raises(ValueError):
        bytes(views[1])
    assert held.tobytes() == b"de"  # still mapped, but the slab's: the documented limit (copy to keep)
    copy = pickle.loads(pickle.dumps(packed))  # a copy starts with a fresh, unreleased guard
    assert [bytes(v) for v in copy] == [b"abc", b"de"]


def test_to_list_lets_malloc_keep_a_batchs_freed_bytes_once_per_process(monkeypatch):
    """glibc gives freed heap above 128 KiB back at once: each batch's items then page-faulted in again
    (~30 µs per 108 KB item against a 4 µs copy). to_list keeps up to 64 MiB of freed heap, with the
    workers' fixed 1 MiB mmap threshold, once per process; the items are the same bytes."""
    import ctypes

    import numpy as np
    import torch

    import dataio.batch as batch_mod
    from dataio.batch import PackedBytes

    calls = []

    class FakeLibc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(batch_mod, "_HEAP_KEPT", False)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeLibc())
    items = [b"a" * 5, b"", b"xyz" * 1000]
    packed = PackedBytes(torch.from_numpy(np.frombuffer(b"".join(items), dtype=np.uint8).copy()),
                         torch.tensor(np.cumsum([0, *map(len, items)]), dtype=torch.int64))
    assert packed.to_list() == items and packed.to_list() == items
    assert calls == [(-3, 1 << 20), (-1, 64 << 20)]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD: once
