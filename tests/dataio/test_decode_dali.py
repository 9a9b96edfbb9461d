"""DALI decode, run for real on the CPU (device_id=None): same contract and pixels as the CPU path.

Pixel tolerances, as mean absolute difference in 0..255 units over a batch:
- MAX_MEAN_ABS = 1.0 where both paths decode at full resolution. Both decode with libjpeg-turbo
  (PNG: libpng/zlib) and resize the same integer crop box with an antialiased linear (triangle)
  filter, so only rounding and filter-weight precision differ: measured ~0.2 on the images below.
  Any real mistake costs far more (a flip, swapped channels, another crop: > 10, checked below).
- MAX_MEAN_ABS_SCALED = 8.0 where the CPU path decodes a JPEG at 1/2..1/8 scale in the DCT
  domain (the crop still spans >= size pixels there) and DALI decodes the full crop: the DCT
  downscale is a box-like filter, DALI's a triangle one. Measured 2..5 mean (6 worst image) on
  these deliberately textured, noisy images; smooth photos differ less.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali")

from dataio import CorruptSampleError, ImageTooLargeError, make_loader  # noqa: E402
from dataio.batch import PackedBytes  # noqa: E402
from dataio.decode.cpu import CpuDecoder, DecodeConfig  # noqa: E402
from dataio.decode.dali import DaliDecoder  # noqa: E402
from dataio.rand import sample_seed  # noqa: E402
from dataio.storage.store import Store  # noqa: E402
from tests.dataio.mixed_images import photo  # noqa: E402
from tests.dataio.shardgen import write_parquet_dataset, write_tar_dataset, write_tar_samples  # noqa: E402

pytestmark = pytest.mark.timeout(120)

MAX_MEAN_ABS = 1.0  # of 255; see the module docstring
MAX_MEAN_ABS_SCALED = 8.0
SEED = 7


IMAGES = [photo(i) for i in range(6)]


def raw_batch(items: list[bytes], ids: list[int] | None = None, *, epoch: int | None = 0, field: str = "jpg") -> dict:
    """A raw batch per dataio/batch.py, as the loader's workers deliver with decode='dali'."""
    n = len(items)
    ids = list(range(n)) if ids is None else ids
    batch = {
        "__key__": [f"{i:06d}" for i in ids], "label": torch.arange(n, dtype=torch.int64),
        field: PackedBytes.pack(items), "mask": torch.ones(n, dtype=torch.bool),
        "read_s": 0.5, "decode_s": 0.25, "batch_number": 3, "__id__": torch.tensor(ids, dtype=torch.int64),
    }
    if epoch is not None:
        batch["epoch"] = epoch
    return batch


def cpu_decode(config: DecodeConfig, items: list[bytes], ids: list[int], *, seed: int = SEED, epoch: int = 0) -> torch.Tensor:
    return CpuDecoder(config).decode_batch(items, seeds=[sample_seed(seed, epoch, i) for i in ids])


def mean_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().mean().item()


@pytest.fixture(scope="module")
def eval_config() -> DecodeConfig:
    return DecodeConfig(size=224, train=False)  # 320x240 sources: no DCT scaling on the CPU path


@pytest.fixture(scope="module")
def train_config() -> DecodeConfig:
    return DecodeConfig(size=224, train=True)


# --- same output as the CPU path ------------------------------------------------------------------


def test_eval_center_crop_matches_cpu_path(eval_config, monkeypatch) -> None:
    # A clock that moves one second per reading: the decoder's own time shows in decode_s without
    # timing anything (each interval it adds is then at least a second).
    ticks = iter(range(10**6))
    monkeypatch.setattr("dataio.decode.dali.time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    out = DaliDecoder(eval_config, batch_size=8, seed=SEED, device="cpu")(raw_batch(IMAGES))
    image = out["image"]
    assert image.shape == (6, 3, 224, 224) and image.dtype == torch.uint8 and image.device.type == "cpu"
    expected = cpu_decode(eval_config, IMAGES, list(range(6)))
    assert mean_abs(image, expected) < MAX_MEAN_ABS
    assert mean_abs(image.flip(-1), expected) > 10 * MAX_MEAN_ABS  # the bound catches a flip
    assert mean_abs(image[:, [2, 1, 0]], expected) > 5 * MAX_MEAN_ABS  # and swapped channels
    # The rest of the batch passes through; the raw field and the id/epoch hints are gone.
    assert "jpg" not in out and "__id__" not in out and "epoch" not in out
    assert out["__key__"] == [f"{i:06d}" for i in range(6)] and out["label"].tolist() == list(range(6))
    assert out["mask"].all() and out["read_s"] == 0.5 and out["batch_number"] == 3
    assert out["decode_s"] >= 0.25 + 1.0  # the workers' decode time, plus the decoder's own


def test_train_crops_and_flips_match_cpu_path_per_sample_seed(train_config) -> None:
    ids = [10, 11, 12, 13, 14, 15]
    dec = DaliDecoder(train_config, batch_size=8, seed=SEED, device="cpu")
    image = dec(raw_batch(IMAGES, ids, epoch=2))["image"]
    assert image.shape == (6, 3, 224, 224) and image.dtype == torch.uint8
    assert 0 <= int(image.min()) and int(image.max()) <= 255 and image.float().std() > 10
    assert mean_abs(image, cpu_decode(train_config, IMAGES, ids, epoch=2)) < MAX_MEAN_ABS
    # Another epoch is another augmentation: the comparison above is not trivially true.
    assert mean_abs(image, cpu_decode(train_config, IMAGES, ids, epoch=3)) > 5 * MAX_MEAN_ABS


def test_train_is_deterministic_per_seed_whatever_the_batching(train_config) -> None:
    batch = raw_batch(IMAGES, epoch=None)  # no epoch in the batch: set_epoch decides
    first = DaliDecoder(train_config, batch_size=6, seed=SEED, device="cpu", prefetch_queue_depth=1)
    again = DaliDecoder(train_config, batch_size=6, seed=SEED, device="cpu", prefetch_queue_depth=3)
    a = first(batch)["image"]
    halves = list(again.map([raw_batch(IMAGES[:4], [0, 1, 2, 3], epoch=None),
                             raw_batch(IMAGES[4:], [4, 5], epoch=None)]))
    assert torch.equal(a, torch.cat([h["image"] for h in halves]))
    assert torch.equal(a, first(batch)["image"])  # and repeated calls too
    first.set_epoch(1)
    assert not torch.equal(a, first(batch)["image"])
    other = DaliDecoder(train_config, batch_size=6, seed=SEED + 1, device="cpu")
    assert not torch.equal(a, other(batch)["image"])


@pytest.mark.parametrize("train", [False, True])
def test_cpu_path_dct_scaling_within_the_loose_bound(train) -> None:
    config = DecodeConfig(size=96, train=train)  # 210-pixel centre crops: the CPU path decodes at 1/2
    image = DaliDecoder(config, batch_size=8, seed=SEED, device="cpu")(raw_batch(IMAGES))["image"]
    assert image.shape == (6, 3, 96, 96)
    assert mean_abs(image, cpu_decode(config, IMAGES, list(range(6)))) < MAX_MEAN_ABS_SCALED


def test_normalize_path(eval_config) -> None:
    config = DecodeConfig(size=224, train=False, normalize=True)
    image = DaliDecoder(config, batch_size=8, seed=SEED, device="cpu")(raw_batch(IMAGES))["image"]
    expected = cpu_decode(config, IMAGES, list(range(6)))
    assert image.dtype == torch.float32 and image.shape == (6, 3, 224, 224)
    std = torch.tensor(config.std).view(1, 3, 1, 1)
    mean = torch.tensor(config.mean).view(1, 3, 1, 1)
    assert image.min() >= ((0 - mean) / std).min() - 1e-4 and image.max() <= ((1 - mean) / std).max() + 1e-4
    # Back in 0..255 units the pixels agree as in the uint8 test.
    assert mean_abs((image * std + mean) * 255, (expected * std + mean) * 255) < MAX_MEAN_ABS


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "P"])
def test_png_input(eval_config, mode) -> None:
    items = [photo(i, (200, 150), fmt="PNG", mode=mode) for i in range(3)]
    image = DaliDecoder(eval_config, batch_size=4, seed=SEED, device="cpu")(raw_batch(items, field="png"))["image"]
    assert image.shape == (3, 3, 224, 224) and image.dtype == torch.uint8
    assert mean_abs(image, cpu_decode(eval_config, items, [0, 1, 2])) < MAX_MEAN_ABS


# --- batch sizes and prefetch ------------------------------------------------------------------


def test_partial_last_batch_and_prefetch_keep_order(eval_config) -> None:
    dec = DaliDecoder(eval_config, batch_size=4, seed=SEED, device="cpu", prefetch_queue_depth=2)
    batches = [raw_batch(IMAGES[:4], [0, 1, 2, 3]), raw_batch(IMAGES[4:5], [4]), raw_batch(IMAGES[:2], [5, 6])]
    outs = list(dec.map(batches))
    assert [o["image"].shape[0] for o in outs] == [4, 1, 2]
    assert [o["__key__"] for o in outs] == [b["__key__"] for b in batches]
    single = DaliDecoder(eval_config, batch_size=4, seed=SEED, device="cpu", prefetch_queue_depth=1)
    for out, batch in zip(outs, batches):
        assert torch.equal(out["image"], single(batch)["image"])  # eval: no randomness at all


def test_abandoned_map_is_superseded(eval_config) -> None:
    dec = DaliDecoder(eval_config, batch_size=4, seed=SEED, device="cpu", prefetch_queue_depth=2)
    old = dec.map(raw_batch(IMAGES[:2], [i, i + 1]) for i in range(0, 8, 2))
    first = next(old)  # leaves batches queued inside DALI
    fresh = dec(raw_batch(IMAGES[2:4], [2, 3]))  # a new iteration, as after a loader restart
    assert torch.equal(fresh["image"], dec(raw_batch(IMAGES[2:4], [2, 3]))["image"])
    assert first["__key__"] == ["000000", "000001"]
    with pytest.raises(RuntimeError, match="superseded"):
        next(old)


@pytest.mark.slow  # runs a new interpreter
def test_dali_is_imported_only_when_a_pipeline_is_built() -> None:
    code = ("import sys, dataio.decode.dali, dataio.loader.shard_loader, dataio.decode.cpu; "
            "sys.exit(1 if any(m.startswith('nvidia.dali') for m in sys.modules) else 0)")
    root = Path(__file__).resolve().parents[2]
    assert subprocess.run([sys.executable, "-c", code], cwd=root, timeout=60).returncode == 0


def test_batch_larger_than_batch_size_is_refused(eval_config) -> None:
    with pytest.raises(ValueError, match="expected 1..2"):
        DaliDecoder(eval_config, batch_size=2, seed=0, device="cpu")(raw_batch(IMAGES[:3]))


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"num_threads": 0}, {"prefetch_queue_depth": 0},
                                    {"device": "tpu"}, {"on_corrupt": "ignore"}, {"seed": -1}])
def test_bad_arguments(eval_config, kwargs) -> None:
    args = {"batch_size": 2, "seed": 0, **kwargs}
    with pytest.raises(ValueError):
        DaliDecoder(eval_config, **args)


# --- corrupt samples ----------------------------------------------------------------------------


TRUNCATED = IMAGES[1][: len(IMAGES[1]) // 3]  # a valid header: only DALI's decode fails, for the batch
GARBAGE = b"\xff\xd8\xff\xe0" + b"\x00" * 64  # not even a header: never reaches DALI


@pytest.mark.parametrize("depth", [1, 3])
def test_corrupt_jpeg_skipped_keeps_batch_size_and_pipeline(eval_config, depth) -> None:
    dec = DaliDecoder(eval_config, batch_size=4, seed=SEED, device="cpu", prefetch_queue_depth=depth,
                      on_corrupt="skip", url_of=lambda i: f"file:///ds/shard-{i // 100}.tar")
    batches = [raw_batch([IMAGES[0], TRUNCATED, IMAGES[2], IMAGES[3]], [0, 1, 2, 3]),
               raw_batch(IMAGES[:4], [4, 5, 6, 7]), raw_batch([GARBAGE, IMAGES[5]], [108, 9])]
    outs = list(dec.map(batches))
    assert [o["image"].shape[0] for o in outs] == [4, 4, 2]
    assert [o["mask"].tolist() for o in outs] == [[True, False, True, True], [True] * 4, [False, True]]
    assert outs[0]["__skipped__"] == ["file:///ds/shard-0.tar#000001"]
    assert outs[2]["__skipped__"] == ["file:///ds/shard-1.tar#000108"]
    assert "__skipped__" not in outs[1]
    assert torch.equal(outs[0]["image"][1], outs[0]["image"][2])  # substitute: the next good sample
    # ... the whole sample, as the CPU path substitutes it (collate.substitute): key and label too
    assert outs[0]["__key__"] == ["000000", "000002", "000002", "000003"]
    assert outs[0]["label"].tolist() == [0, 2, 2, 3] and outs[2]["label"].tolist() == [1, 1]
    assert dec.num_rebuilds == 1  # the truncated JPEG failed DALI's batch once; the garbage never got there
    good = cpu_decode(eval_config, IMAGES[:4], [0, 1, 2, 3])
    assert mean_abs(outs[0]["image"][[0, 2, 3]], good[[0, 2, 3]]) < MAX_MEAN_ABS  # that batch: CPU decode
    assert mean_abs(outs[1]["image"], good) < MAX_MEAN_ABS  # the rebuilt pipeline decodes again
    assert mean_abs(dec(raw_batch(IMAGES[:4]))["image"], good) < MAX_MEAN_ABS


def test_corrupt_jpeg_raises_naming_url_and_key(eval_config) -> None:
    dec = DaliDecoder(eval_config, batch_size=4, seed=SEED, device="cpu", url_of=lambda i: "s3://b/ds/shard-000000.tar")
    with pytest.raises(CorruptSampleError, match=r"s3://b/ds/shard-000000.tar: sample '000001'") as info:
        dec(raw_batch([IMAGES[0], TRUNCATED], [0, 1]))
    assert info.value.key == "000001"
    assert dec(raw_batch(IMAGES[:2]))["image"].shape == (2, 3, 224, 224)  # usable afterwards


def test_pixel_limit_and_unsupported_format_go_to_the_cpu_path() -> None:
    config = DecodeConfig(size=32, train=False, max_pixels=200 * 150)
    gif = photo(0, (120, 90), fmt="GIF")
    dec = DaliDecoder(config, batch_size=4, seed=0, device="cpu", on_corrupt="skip")
    out = dec(raw_batch([IMAGES[0], gif, photo(1, (150, 100))]))  # 320x240 is over the limit
    assert out["mask"].tolist() == [False, True, True] and dec.num_rebuilds == 0
    assert dec.num_cpu_samples == 2  # the bomb (refused by CpuDecoder) and the GIF (decoded there)
    with pytest.raises(ImageTooLargeError, match="000000"):
        DaliDecoder(config, batch_size=4, seed=0, device="cpu")(raw_batch([IMAGES[0]]))


# --- GPU ---------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for DALI's mixed decoder")
@pytest.mark.parametrize("train", [False, True])
def test_mixed_gpu_decode_matches_cpu_operators(train) -> None:
    config = DecodeConfig(size=224, train=train)
    gpu = DaliDecoder(config, batch_size=8, seed=SEED, device="cuda")(raw_batch(IMAGES))["image"]
    cpu = DaliDecoder(config, batch_size=8, seed=SEED, device="cpu")(raw_batch(IMAGES))["image"]
    assert gpu.device.type == "cuda" and gpu.dtype == torch.uint8 and gpu.shape == cpu.shape
    assert mean_abs(gpu.cpu(), cpu) < MAX_MEAN_ABS  # nvJPEG's IDCT vs libjpeg-turbo's, same filters


# --- through the loader -------------------------------------------------------------------------


SIZES = [9, 0, 6, 1, 11]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("dali") / "ds")
    write_tar_dataset(Store(root), SIZES, real_images=True)
    return root


@pytest.fixture(scope="module")
def photo_dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two tar shards of photo-like JPEGs (pixel comparisons need texture, not flat colours)."""
    store = Store(str(tmp_path_factory.mktemp("dali_photos") / "ds"))
    shards = [[{"__key__": f"{i:06d}", "jpg": photo(i, (120, 90)), "cls": i % 3, "json": b"{}"}
               for i in range(first, first + n)] for first, n in ((0, 7), (7, 5))]
    write_tar_samples(store, shards)
    return store.raw_url


def test_loader_dali_batches_match_cpu_batches(photo_dataset) -> None:
    options = dict(batch_size=4, num_workers=1, image_size=64, train=False, seed=3)
    with make_loader(photo_dataset, decode="cpu", **options) as loader:
        cpu = list(loader)
    with make_loader(photo_dataset, decode="dali", **options) as loader:
        dali = list(loader)
    assert [b["__key__"] for b in dali] == [b["__key__"] for b in cpu]
    for d, c in zip(dali, cpu):
        assert d.keys() == c.keys()  # the same contract: --decode dali changes nothing else
        assert torch.equal(d["label"], c["label"]) and torch.equal(d["mask"], c["mask"])
        assert d["image"].shape == c["image"].shape == (4, 3, 64, 64) and d["image"].dtype == torch.uint8
        assert mean_abs(d["image"], c["image"]) < MAX_MEAN_ABS


def test_loader_skips_a_corrupt_image_alike_through_dali_and_cpu(tmp_path) -> None:
    # The substitute of a skipped sample is the whole next good sample on both paths: same keys,
    # labels and masks (a truncated JPEG fails DALI's batch; one that is garbage never reaches it).
    store = Store(str(tmp_path / "ds"))
    shards = [[{"__key__": f"{i:06d}", "jpg": photo(i, (120, 90)), "cls": i % 3} for i in range(first, first + n)]
              for first, n in ((0, 7), (7, 5))]
    shards[0][2]["jpg"] = shards[0][2]["jpg"][: len(shards[0][2]["jpg"]) // 3]
    shards[1][1]["jpg"] = GARBAGE
    write_tar_samples(store, shards)
    options = dict(batch_size=4, num_workers=1, image_size=32, train=False, seed=3, on_corrupt="skip", tail="pad")
    got = {}
    for decode in ("cpu", "dali"):
        with make_loader(store.raw_url, decode=decode, **options) as loader:
            got[decode] = [(b["__key__"], b["label"].tolist(), b["mask"].tolist()) for b in loader]
            assert loader.stats.corrupt_skipped == 2
    assert got["dali"] == got["cpu"]
    assert sum(m.count(False) for _, _, m in got["cpu"]) >= 2


def real_keys(batches: list[dict]) -> list[str]:
    return [k for b in batches for k, m in zip(b["__key__"], b["mask"].tolist()) if m]


def test_loader_epoch_is_exactly_once_through_dali(dataset) -> None:
    with make_loader(dataset, batch_size=4, num_workers=1, decode="dali", image_size=32, tail="pad") as loader:
        batches = list(loader)
    assert len(real_keys(batches)) == len(set(real_keys(batches))) == sum(SIZES)
    for batch in batches:
        assert batch["image"].shape == (4, 3, 32, 32) and batch["image"].dtype == torch.uint8
        assert "jpg" not in batch and batch["decode_s"] > 0


@pytest.mark.parametrize("resume_workers", [0, 2])
def test_loader_resume_through_dali(dataset, resume_workers) -> None:
    options = dict(batch_size=3, num_workers=0, decode="dali", image_size=32, seed=5)
    with make_loader(dataset, **options) as loader:
        full = list(loader)
    with make_loader(dataset, **options) as loader:
        it = iter(loader)
        first = [next(it) for _ in range(2)]
        state = loader.state_dict()
    with make_loader(dataset, **{**options, "num_workers": resume_workers}) as loader:
        loader.load_state_dict(state)
        rest = list(loader)
    if resume_workers == 0:  # the same topology replays the same order
        assert real_keys(first + rest) == real_keys(full)
    else:  # another one delivers exactly the samples not yet delivered, in its own order
        assert sorted(real_keys(first + rest)) == sorted(real_keys(full))
        assert len(set(real_keys(first + rest))) == len(real_keys(first + rest))
    # Augmentation is seeded per sample, not per position in DALI's stream: a resumed run crops
    # and flips every sample exactly as the uninterrupted one did.
    resumed = {k: img for b in first + rest for k, img in zip(b["__key__"], b["image"])}
    for batch in full:
        for key, image in zip(batch["__key__"], batch["image"]):
            assert torch.equal(resumed[key], image), key


@pytest.fixture(scope="module")
def mixed_sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two tar datasets of photo-like JPEGs and a Parquet one, to mix."""
    root = tmp_path_factory.mktemp("dali_mix")
    urls = {}
    for name, first, sizes in (("tar_a", 0, (6, 5)), ("tar_b", 100, (7,))):
        store = Store(str(root / name))
        starts = np.cumsum((first, *sizes))
        write_tar_samples(store, [[{"__key__": f"{i:06d}", "jpg": photo(i, (120, 90)), "cls": i % 3, "json": b"{}"}
                                   for i in range(a, a + n)] for a, n in zip(starts, sizes)])
        urls[name] = store.raw_url
    urls["parquet"] = str(root / "parquet")
    write_parquet_dataset(Store(urls["parquet"]), [5, 4], real_images=True, seed=2)
    return urls


@pytest.mark.parametrize("second", ["tar_b", "parquet"])
def test_dali_decodes_a_mixture_with_each_sample_source(mixed_sources, second) -> None:
    """decode="dali" on a 2-source mixture (tar + tar, tar + Parquet): the CPU path's batches, the
    per-sample source index included, with DALI's pixels."""
    urls = [mixed_sources["tar_a"], mixed_sources[second]]
    options = dict(weights=[2, 1], batch_size=4, num_workers=1, image_size=48, train=False, seed=3, tail="pad")
    with make_loader(urls, decode="cpu", **options) as loader:
        cpu = list(loader)
        counts = loader.mixture.counts.tolist()
    with make_loader(urls, decode="dali", **options) as loader:
        dali = list(loader)
    assert len(dali) == len(cpu) > 0
    for d, c in zip(dali, cpu):
        assert d.keys() == c.keys() and "source" in d  # the same contract as the CPU path
        assert d["source"].dtype == torch.int64 and torch.equal(d["source"], c["source"])
        assert d["__key__"] == c["__key__"] and torch.equal(d["label"], c["label"])
        assert d["image"].shape == (4, 3, 48, 48) and d["image"].dtype == torch.uint8
        assert mean_abs(d["image"], c["image"]) < MAX_MEAN_ABS_SCALED
    real = [s for b in dali for s, m in zip(b["source"].tolist(), b["mask"].tolist()) if m]
    assert [real.count(0), real.count(1)] == counts  # each source its count, through DALI
