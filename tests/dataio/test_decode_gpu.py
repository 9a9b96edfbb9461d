"""The GPU decoder on CPU twins: its batched crop arithmetic, its fallback chain, mixed formats, the corrupt policy.

No GPU is needed: the crop/resize runs on CPU tensors, and gpu_codecs.CpuTwin stands in for the device
decoder (it decodes with PIL, and refuses the samples a test names). Pixel tolerances (mean absolute
difference, 0..255) as in test_decode_dali.py: the batched resize against torch's antialiased resize of
the same box is within one grey level per pixel; against the CPU path, which decodes JPEGs at 1/2..1/8
scale in the DCT domain where the crop allows, MAX_MEAN_ABS_SCALED.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dataio import CorruptSampleError
from dataio.batch import PackedBytes
from dataio.decode.cpu import CpuDecoder, DecodeConfig
from dataio.decode.gpu import GpuDecoder
from dataio.decode.gpu_codecs import CpuTwin, pick_codec
from dataio.decode.gpu_crop import crop_resize, resize_weights
from dataio.rand import sample_seed
from tests.dataio import mixed_images

MAX_MEAN_ABS_SCALED = 8.0
SEED = 7


def photo(i: int, size: tuple[int, int] = (160, 120), fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    """The DALI tests' photo-like image (tests/dataio/mixed_images.py), smaller by default."""
    return mixed_images.photo(i, size, fmt, mode)


def raw_batch(items: list[bytes], *, epoch: int = 0) -> dict:
    """A raw batch as the loader's GPU feed hands it to the decoder ("__id__" and "epoch" added)."""
    n = len(items)
    return {"__key__": [f"{i:06d}" for i in range(n)], "label": torch.arange(n), "jpg": PackedBytes.pack(items),
            "mask": torch.ones(n, dtype=torch.bool), "read_s": 0.5, "decode_s": 0.25,
            "__id__": torch.arange(n, dtype=torch.int64), "epoch": epoch}


def cpu_images(config: DecodeConfig, items: list[bytes], *, epoch: int = 0) -> torch.Tensor:
    return CpuDecoder(config).decode_batch(items, seeds=[sample_seed(SEED, epoch, i) for i in range(len(items))])


def mean_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().mean().item()


class Recording(CpuTwin):
    """A CpuTwin that records the bytes it was given (each sample must reach one decoder once)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.seen: list[bytes] = []

    def decode(self, items, boxes):
        self.seen.extend(bytes(i) for i in items)
        return super().decode(items, boxes)


def test_batched_crop_matches_the_cpu_paths_boxes_and_resize() -> None:
    # The CPU path's own boxes and flips (CpuDecoder._plan from each sample's seed), cropped and
    # resized one by one with its resize (torch, antialiased): the batched kernel gives those pixels.
    rng = np.random.default_rng(0)
    shapes = [(120, 160), (375, 500), (90, 60), (200, 200), (33, 47)]
    images = [torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)) for h, w in shapes]
    dec = CpuDecoder(DecodeConfig(size=48))
    plans = [dec._plan(h, w, sample_seed(SEED, 2, i)) for i, (h, w) in enumerate(shapes)]
    assert any(flip for _, flip in plans) and not all(flip for _, flip in plans)
    boxes = torch.tensor([[b.top, b.left, b.height, b.width] for b, _ in plans])
    out = crop_resize(images, boxes, torch.tensor([f for _, f in plans]), size=48)
    assert out.shape == (5, 3, 48, 48) and out.dtype == torch.uint8
    for image, (box, flip), got in zip(images, plans, out):
        crop = image[:, box.top: box.top + box.height, box.left: box.left + box.width].unsqueeze(0)
        want = F.interpolate(crop, size=(48, 48), mode="bilinear", antialias=True, align_corners=False)[0]
        want = want.flip(-1) if flip else want
        assert (want.int() - got.int()).abs().max().item() <= 1
        if box.width > 1:  # the other flip (or another box) is far off: the check can fail
            assert mean_abs(want.flip(-1), got) > 5 or torch.equal(want, want.flip(-1))


def test_resize_weights_sum_to_one_inside_the_box_and_zero_outside() -> None:
    w = resize_weights(torch.tensor([3, 0]), torch.tensor([10, 64]), size=4, extent=80)
    assert w.shape == (2, 4, 80)
    assert torch.allclose(w.sum(dim=2), torch.ones(2, 4))
    assert w[0, :, :3].abs().sum() == 0 and w[0, :, 13:].abs().sum() == 0
    assert w[1, :, 64:].abs().sum() == 0


def test_normalized_output_is_the_uint8_output_normalized() -> None:
    img = [torch.from_numpy(np.random.default_rng(1).integers(0, 256, (3, 40, 50), dtype=np.uint8))]
    boxes, flips = torch.tensor([[2, 3, 30, 40]]), torch.tensor([False])
    u8 = crop_resize(img, boxes, flips, size=16)
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    f32 = crop_resize(img, boxes, flips, size=16, mean_std=(mean, std))
    assert torch.allclose(f32, (u8.float() / 255 - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1), atol=1e-5)


@pytest.mark.parametrize("regions", [False, True])
@pytest.mark.parametrize("train", [True, False])
def test_gpu_decoder_on_a_cpu_twin_gives_the_cpu_paths_pixels(regions, train) -> None:
    config = DecodeConfig(size=48, train=train)
    items = [photo(i) for i in range(6)]
    dec = GpuDecoder(config, seed=SEED, codec=CpuTwin(regions=regions))
    out = dec(raw_batch(items, epoch=1))
    want = cpu_images(config, items, epoch=1)
    assert out["image"].shape == (6, 3, 48, 48) and out["image"].dtype == torch.uint8
    assert mean_abs(out["image"], want) < MAX_MEAN_ABS_SCALED
    assert mean_abs(out["image"], cpu_images(config, items, epoch=2)) > mean_abs(out["image"], want) or not train
    assert dec.num_device_samples == 6 and dec.num_cpu_samples == 0
    assert "jpg" not in out and "__id__" not in out and "epoch" not in out
    assert out["decode_s"] > 0.25 and out["label"].tolist() == list(range(6))


def test_refused_samples_are_decoded_on_the_cpu_inside_the_same_batch() -> None:
    config = DecodeConfig(size=32, train=False)
    items = [photo(i) for i in range(6)]
    refused = {items[1], items[4]}
    twin = Recording(refuse=lambda data: bytes(data) in refused)
    dec = GpuDecoder(config, seed=SEED, codec=twin)
    out = dec(raw_batch(items))
    assert dec.num_device_samples == 4 and dec.num_cpu_samples == 2
    want = cpu_images(config, items)
    assert torch.equal(out["image"][[1, 4]], want[[1, 4]])  # the CPU path's own pixels
    assert mean_abs(out["image"], want) < MAX_MEAN_ABS_SCALED
    assert out["mask"].all()


def test_without_a_device_decoder_every_sample_takes_the_cpu_path() -> None:
    codec, why = pick_codec(torch.device("cpu"))
    assert codec is None and "CPU path" in why
    config = DecodeConfig(size=32)
    items = [photo(i) for i in range(3)]
    dec = GpuDecoder(config, seed=SEED, codec=None)
    assert torch.equal(dec(raw_batch(items))["image"], cpu_images(config, items))
    assert dec.num_cpu_samples == 3


def test_mixed_formats_are_each_decoded_once_by_one_decoder() -> None:
    items = [photo(0), photo(1, fmt="PNG"), photo(2, mode="CMYK"), photo(3, fmt="GIF", mode="P"),
             photo(4, mode="L"), photo(5, fmt="WEBP"), photo(6)]
    twin = Recording()
    dec = GpuDecoder(DecodeConfig(size=32), seed=SEED, codec=twin)
    out = dec(raw_batch(items))
    assert sorted(twin.seen) == sorted([items[0], items[4], items[6]])  # JPEG (RGB or grey) only
    assert dec.num_device_samples == 3 and dec.num_cpu_samples == 4
    assert mean_abs(out["image"], cpu_images(DecodeConfig(size=32), items)) < MAX_MEAN_ABS_SCALED


GARBAGE = b"\xff\xd8\xff\xe0 not really a jpeg" * 4


def test_corrupt_samples_raise_or_are_substituted_and_masked() -> None:
    items = [photo(0), GARBAGE, photo(2), photo(3)]
    twin = CpuTwin()
    with pytest.raises(CorruptSampleError, match="000001"):
        GpuDecoder(DecodeConfig(size=32), seed=SEED, codec=twin)(raw_batch(items))
    dec = GpuDecoder(DecodeConfig(size=32), seed=SEED, codec=twin, on_corrupt="skip", url_of=lambda i: f"shard#{i}")
    out = dec(raw_batch(items))
    assert out["mask"].tolist() == [True, False, True, True]
    assert out["__key__"] == ["000000", "000002", "000002", "000003"]  # the next good sample, whole
    assert out["label"].tolist() == [0, 2, 2, 3] and torch.equal(out["image"][1], out["image"][2])
    assert out["__skipped__"] == ["shard#1#000001"]
    with pytest.raises(CorruptSampleError, match="every sample"):
        dec(raw_batch([GARBAGE, GARBAGE]))


@pytest.mark.parametrize("regions", [True, False])
def test_nvimagecodec_path_on_its_cpu_backend_gives_the_cpu_paths_pixels(regions) -> None:
    # The real NvImgCodec code (sources, regions, images to torch) with nvImageCodec's CPU backend.
    pytest.importorskip("nvidia.nvimgcodec")
    from dataio.decode.gpu_codecs import NvImgCodec

    codec = NvImgCodec(torch.device("cpu"), regions=regions)
    items = [photo(i) for i in range(5)] + [photo(9, mode="L"), photo(10, fmt="PNG")]
    config = DecodeConfig(size=48)
    dec = GpuDecoder(config, seed=SEED, codec=codec)
    out = dec(raw_batch(items))
    assert dec.num_device_samples == 6 and dec.num_cpu_samples == 1 and codec.regions == regions
    assert mean_abs(out["image"], cpu_images(config, items)) < MAX_MEAN_ABS_SCALED


def test_device_codec_on_cuda_gives_the_cpu_paths_pixels() -> None:
    # On a GPU machine (gpu_check runs it): the first device decoder that builds, on the device.
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    codec, why = pick_codec(torch.device("cuda", 0))
    if codec is None:
        pytest.skip(why)
    config = DecodeConfig(size=48)
    items = [photo(i) for i in range(6)]
    dec = GpuDecoder(config, seed=SEED, codec=codec)
    out = dec(raw_batch(items))
    assert out["image"].is_cuda and dec.num_device_samples == 6
    assert mean_abs(out["image"].cpu(), cpu_images(config, items)) < MAX_MEAN_ABS_SCALED
