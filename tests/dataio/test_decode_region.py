"""JPEG region decode: pixel parity with the full decode, the same crops as today, fallbacks, errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import simplejpeg

from dataio import CorruptSampleError, ImageTooLargeError
from dataio.decode import region
from dataio.decode.cpu import CpuDecoder, DecodeConfig
from tests.dataio.test_decode_cpu import URL, _encode, _jpeg_declaring, _pixels

needs_region = pytest.mark.skipif(not region.available(), reason=f"region decode not built: {region.why_unavailable()}")
# Every JPEG layout libjpeg decodes differently: chroma 4:2:0 / 4:2:2 / 4:4:4, greyscale, progressive.
LAYOUTS = {"420": {"subsampling": 2}, "422": {"subsampling": 1}, "444": {"subsampling": 0},
           "gray": {"mode": "L"}, "progressive": {"progressive": True}, "odd_size_420": {"subsampling": 2}}
MAD_TOLERANCE = 1.0  # grey levels; measured 0: the window's pixels are the full decode's, bit for bit


def _noisy_jpeg(layout: str) -> bytes:
    height, width = (131, 173) if layout.startswith("odd") else (200, 264)
    arr = _pixels(height, width)
    arr = np.clip(arr + np.random.default_rng(1).normal(0, 18, arr.shape), 0, 255).astype(np.uint8)
    kw = dict(LAYOUTS[layout])
    return _encode(arr, "JPEG", mode=kw.pop("mode", None), quality=90, **kw)


@needs_region
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("denom", [1, 2, 4, 8])
def test_region_equals_the_full_decode_window(layout, denom):
    """Any window, at any DCT scale, equals the same window of simplejpeg's full decode at that scale
    (windows 1 pixel wide, on iMCU edges and at the image's edges included)."""
    data = _noisy_jpeg(layout)
    rng = np.random.default_rng(denom)
    height, width = simplejpeg.decode_jpeg_header(data)[:2]
    scaled = (-(-height // denom), -(-width // denom))
    full = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=scaled[0], min_width=scaled[1])
    assert full.shape[:2] == scaled
    windows = [(0, 0, scaled[1], scaled[0]), (scaled[1] - 1, scaled[0] - 1, scaled[1], scaled[0])]
    for _ in range(40):
        x0, y0 = int(rng.integers(0, scaled[1])), int(rng.integers(0, scaled[0]))
        windows.append((x0, y0, int(rng.integers(x0 + 1, scaled[1] + 1)), int(rng.integers(y0 + 1, scaled[0] + 1))))
    for x0, y0, x1, y1 in windows:
        got = region.decode_window(data, denom=denom, window=(x0, y0, x1, y1), scaled_hw=scaled)
        diff = np.abs(got.astype(np.int16) - full[y0:y1, x0:x1])
        assert diff.mean() <= MAD_TOLERANCE, (x0, y0, x1, y1, diff.mean())


@needs_region
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("layout", ["420", "gray", "progressive", "odd_size_420"])
def test_decoder_gives_todays_crops(layout, train):
    """Same window, same RNG stream, same flip: the region path's tensors equal today's (simplejpeg)."""
    data = _noisy_jpeg(layout)
    today = CpuDecoder(DecodeConfig(size=48, train=train, decoder="simplejpeg"))
    ours = CpuDecoder(DecodeConfig(size=48, train=train, decoder="region"))
    for seed in range(12):
        assert np.abs(ours.decode(data, seed=seed).astype(np.int16) - today.decode(data, seed=seed)).mean() <= 1.0


@needs_region
@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("shape", [(224, 224), (7, 5), (1, 33)])
def test_to_planes_is_the_transpose_and_flip(shape, flip):
    """The C layout change after the resize: (H, W, 3) -> (3, H, W), mirrored left-right if flip."""
    hwc = np.random.default_rng(3).integers(0, 256, (*shape, 3), dtype=np.uint8)
    out = np.empty((3, *shape), dtype=np.uint8)
    region.to_planes(hwc, out, flip=flip)
    want = hwc.transpose(2, 0, 1)
    assert np.array_equal(out, want[:, :, ::-1] if flip else want)
    with pytest.raises(ValueError, match="bytes for"):
        region.to_planes(hwc, np.empty((3, shape[0] + 1, shape[1]), dtype=np.uint8), flip=flip)


@needs_region
@pytest.mark.parametrize("variant", ["uint8", "normalize", "transform", "eval"])
def test_region_path_tensors_equal_todays_bit_for_bit(variant):
    """Crop, flip, resize, normalization and the user transform: the region path's tensors equal
    today's (simplejpeg + F.interpolate + numpy flip) exactly, not only within a tolerance."""
    data = _noisy_jpeg("420")
    kw = {"normalize": variant == "normalize", "train": variant != "eval"}
    transform = (lambda t: t.flip(1)) if variant == "transform" else None  # noqa: E731 - a user's vertical flip
    today = CpuDecoder(DecodeConfig(size=40, decoder="simplejpeg", **kw), transform=transform)
    ours = CpuDecoder(DecodeConfig(size=40, decoder="region", **kw), transform=transform)
    seeds = list(range(16))  # both flips drawn
    got = ours.decode_batch([data] * len(seeds), seeds=seeds)
    assert torch.equal(got, today.decode_batch([data] * len(seeds), seeds=seeds))


@needs_region
def test_an_older_build_without_to_planes_still_decodes_the_same(monkeypatch):
    """An extension built before to_planes existed decodes regions and leaves the layout to torch."""
    data, seeds = _noisy_jpeg("420"), list(range(8))
    want = CpuDecoder(DecodeConfig(size=40, decoder="region")).decode_batch([data] * 8, seeds=seeds)
    monkeypatch.setattr(region, "_region", type("OldBuild", (), {"decode": staticmethod(region._region.decode)}))
    older = CpuDecoder(DecodeConfig(size=40, decoder="region"))
    assert older._use_region and not older._use_planes
    assert torch.equal(older.decode_batch([data] * 8, seeds=seeds), want)


@needs_region
@pytest.mark.parametrize("mode", ["CMYK", None])
def test_cmyk_and_other_formats_keep_todays_decode(mode):
    """CMYK/YCCK JPEGs (libjpeg cannot make RGB of them) and PNGs decode exactly as before."""
    arr = _pixels(90, 120)
    data = _encode(arr, "JPEG", mode=mode, quality=95) if mode else _encode(arr, "PNG")
    today = CpuDecoder(DecodeConfig(size=32, decoder="simplejpeg"))
    ours = CpuDecoder(DecodeConfig(size=32, decoder="region"))
    for seed in range(4):
        assert np.array_equal(ours.decode(data, seed=seed), today.decode(data, seed=seed))


@needs_region
@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_truncated_jpeg_gives_todays_error(cut):
    good = _noisy_jpeg("420")
    bad = good[: int(len(good) * cut)]
    messages = []
    for decoder in ("region", "simplejpeg"):
        with pytest.raises(CorruptSampleError) as info:
            CpuDecoder(DecodeConfig(size=32, decoder=decoder)).decode_batch(
                [good, bad], seeds=[0, 1], keys=["good", "000042"], url=URL)
        assert info.value.key == "000042" and URL in str(info.value)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


@needs_region
def test_pixel_limit_still_refuses_bombs():
    with pytest.raises(ImageTooLargeError) as info:
        CpuDecoder(DecodeConfig(size=32, decoder="region")).decode(_jpeg_declaring(60_000, 60_000), seed=0,
                                                                   key="bomb", url=URL)
    assert info.value.key == "bomb"


def test_without_the_extension_auto_warns_once_and_decodes_as_before(monkeypatch):
    monkeypatch.setattr(region, "_region", None)
    monkeypatch.setattr(region, "_LOAD_ERROR", "ImportError: not built")
    monkeypatch.setattr(region, "_WARNED", type(region._WARNED)())
    data = _noisy_jpeg("420")
    with pytest.warns(RuntimeWarning, match="region decode is not available.*libjpeg62-turbo-dev") as record:
        first = CpuDecoder(DecodeConfig(size=32))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            second = CpuDecoder(DecodeConfig(size=32))  # once per process, not per decoder or image
    assert len(record) == 1
    today = CpuDecoder(DecodeConfig(size=32, decoder="simplejpeg"))
    assert np.array_equal(first.decode(data, seed=5), today.decode(data, seed=5))
    assert np.array_equal(second.decode(data, seed=5), today.decode(data, seed=5))
    with pytest.raises(ValueError, match="decoder='region'.*not available"):
        DecodeConfig(decoder="region")


@needs_region
def test_auto_uses_region_where_it_loads(monkeypatch):
    calls = []
    real = region.decode_window
    monkeypatch.setattr(region, "decode_window", lambda *a, **k: calls.append(1) or real(*a, **k))
    CpuDecoder(DecodeConfig(size=32)).decode(_noisy_jpeg("420"), seed=0)
    CpuDecoder(DecodeConfig(size=32, train=False)).decode(_noisy_jpeg("420"), seed=0)  # eval: same path
    assert len(calls) == 2




@needs_region
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for nvJPEG")
@pytest.mark.parametrize("layout", ["444", "420"])
def test_nvjpeg_gpu_decode_agrees_with_region_decode(layout):
    """torchvision's nvJPEG (what gpu_check measures) decodes the pixels our CPU path crops.

    Without chroma subsampling (4:4:4) nvJPEG and libjpeg-turbo agree bit for bit (measured on an
    H200, 2026-11-27: MAD 0). With 4:2:0, nvJPEG upsamples chroma its own way, not with libjpeg's
    "fancy" triangle filter: measured MAD 3.1 grey levels (max 87, on a colour edge) against
    simplejpeg's full decode on this noise-heavy image, 0.7 on a smooth one. The region window is
    the full decode's window bit for bit, so it differs from nvJPEG exactly as the full decode does.
    """
    decode_jpeg = pytest.importorskip("torchvision.io").decode_jpeg
    data = _noisy_jpeg(layout)
    height, width = simplejpeg.decode_jpeg_header(data)[:2]
    gpu = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), device="cuda").cpu()
    ours = region.decode_window(data, denom=1, window=(10, 20, 150, 180), scaled_hw=(height, width))
    full = simplejpeg.decode_jpeg(data, colorspace="RGB")[20:180, 10:150]
    assert gpu.shape == (3, height, width)
    assert np.array_equal(ours, full)
    gpu_window = gpu[:, 20:180, 10:150].permute(1, 2, 0).numpy().astype(np.int16)
    mad = np.abs(gpu_window - ours).mean()
    assert mad <= (MAD_TOLERANCE if layout == "444" else 5.0), f"{layout}: nvJPEG vs region decode MAD {mad:.2f}"
