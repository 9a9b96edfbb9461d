"""CPU decode and augmentation: shapes, determinism, crop geometry, reduced decode, errors, bombs."""

from __future__ import annotations

import functools
import io
import pickle
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from dataio import CorruptSampleError, ImageTooLargeError
from dataio.decode.cpu import CpuDecoder, DecodeConfig
from dataio.decode.transforms import center_crop, jpeg_scale_denom, random_resized_crop
from dataio.rand import SampleRandom, sample_seed

DECODERS = ("simplejpeg", "pil")
URL = "s3://bucket/ds/shards/shard-000007.tar"


def _pixels(height: int, width: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    """A smooth test picture (gradients, a disc, mild noise): natural enough for lossy codecs."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    disc = (x - width / 2) ** 2 + (y - height / 2) ** 2 < (min(height, width) / 3) ** 2
    base = [x / max(width, 1), y / max(height, 1), disc]
    noise = np.random.default_rng(seed).normal(0, 4, (height, width, 3))
    img = np.stack(base, -1) * 220 + 16 + noise
    return np.clip(img, 0, 255).astype(np.uint8)[..., :channels].squeeze()


def _encode(arr: np.ndarray, fmt: str, mode: str | None = None, **kw) -> bytes:
    img = Image.fromarray(arr)
    if mode:
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


@functools.cache
def _jpeg(height: int, width: int) -> bytes:
    return _encode(_pixels(height, width), "JPEG", quality=92)


def _reference(data: bytes, box, size: int) -> np.ndarray:
    """Full decode, then crop and bilinear resize: what reduced decoding must approximate. CHW."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    crop = img.crop((box.left, box.top, box.left + box.width, box.top + box.height))  # as torchvision does
    out = crop.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(out).transpose(2, 0, 1)


def _mean_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float32) - b.astype(np.float32)).mean())


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("case", ["jpeg", "jpeg_gray", "jpeg_cmyk", "png", "png_gray", "png_rgba", "png_palette",
                                  "png_16bit", "webp", "tiny_1x1", "tiny_7x5", "wide_2000x3", "tall_3x900"])
def test_shapes_and_dtypes(case, train, decoder):
    rgb = _pixels(120, 160)
    data = {
        "jpeg": _encode(rgb, "JPEG"),
        "jpeg_gray": _encode(rgb[..., 0], "JPEG"),
        "jpeg_cmyk": _encode(rgb, "JPEG", mode="CMYK"),
        "png": _encode(rgb, "PNG"),
        "png_gray": _encode(rgb[..., 1], "PNG"),
        "png_rgba": _encode(rgb, "PNG", mode="RGBA"),
        "png_palette": _encode(rgb, "PNG", mode="P"),
        "png_16bit": _encode(rgb[..., 0].astype(np.uint16) * 257, "PNG"),
        "webp": _encode(rgb, "WEBP"),
        "tiny_1x1": _encode(_pixels(1, 1), "PNG"),
        "tiny_7x5": _encode(_pixels(5, 7), "JPEG"),
        "wide_2000x3": _encode(_pixels(3, 2000), "JPEG"),
        "tall_3x900": _encode(_pixels(900, 3), "PNG"),
    }[case]
    dec = CpuDecoder(DecodeConfig(size=32, train=train, decoder=decoder))
    out = dec.decode(data, seed=5, key="k", url=URL)
    assert out.shape == (3, 32, 32) and out.dtype == np.uint8
    assert out.std() > 0 or case == "tiny_1x1"  # real pixels, not an empty buffer


@pytest.mark.parametrize("decoder", DECODERS)
def test_colour_conversions_keep_the_picture(decoder):
    """Greyscale gives three equal channels; CMYK and RGBA come back close to the RGB original."""
    rgb = _pixels(96, 128)
    dec = CpuDecoder(DecodeConfig(size=48, train=False, decoder=decoder))
    want = dec.decode(_encode(rgb, "PNG"), seed=0)
    for data in (_encode(rgb[..., 0], "JPEG", quality=95), _encode(rgb[..., 0], "PNG")):
        grey = dec.decode(data, seed=0)
        assert np.abs(grey.astype(int) - grey[:1]).max() <= 1
    assert _mean_abs(dec.decode(_encode(rgb, "JPEG", mode="CMYK", quality=95), seed=0), want) < 3
    assert _mean_abs(dec.decode(_encode(rgb, "PNG", mode="RGBA"), seed=0), want) == 0


def test_16bit_png_keeps_its_range():
    """16-bit greyscale maps to its top 8 bits, not clipped to white."""
    grey = np.full((40, 40), 100 * 257, dtype=np.uint16)
    out = CpuDecoder(DecodeConfig(size=16, train=False)).decode(_encode(grey, "PNG"), seed=0)
    assert np.all(out == 100)


@pytest.mark.parametrize("pixels, want", [
    (np.full((40, 40), 0.5, np.float32), 128),  # float in [0, 1]: scaled by 255 (was clipped: 0 or 1)
    (np.full((40, 40), 77.0, np.float32), 77),  # float beyond 1: a 0-255 scale, kept
    (np.full((40, 40), 300.0, np.float32), 255),  # clipped
    (np.full((40, 40), 0x40 << 24, np.int32), 64),  # 32-bit integer: its top 8 bits (was clipped to 255)
])
def test_float_and_32bit_tiffs_keep_their_range(pixels, want):
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="TIFF")
    out = CpuDecoder(DecodeConfig(size=16, train=False)).decode(buf.getvalue(), seed=0)
    assert np.all(out == want)


@pytest.mark.parametrize("decoder", DECODERS)
def test_same_seed_same_pixels_and_seeds_vary(decoder):
    data = _jpeg(240, 320)
    dec = CpuDecoder(DecodeConfig(size=64, decoder=decoder))
    first = dec.decode(data, seed=123)
    assert np.array_equal(first, dec.decode(data, seed=123))
    assert np.array_equal(first, pickle.loads(pickle.dumps(dec)).decode(data, seed=123))  # in another worker
    others = [dec.decode(data, seed=s) for s in range(1, 9)]
    assert sum(not np.array_equal(first, o) for o in others) >= 7


def test_decoders_agree_for_one_seed():
    """The crop depends on the seed only, so simplejpeg and PIL give (almost) the same pixels."""
    data = _jpeg(300, 400)
    for seed in range(5):
        a = CpuDecoder(DecodeConfig(size=96, decoder="simplejpeg")).decode(data, seed=seed)
        b = CpuDecoder(DecodeConfig(size=96, decoder="pil")).decode(data, seed=seed)
        assert _mean_abs(a, b) < 1.5


def test_sample_seed_is_a_stable_counter_hash():
    # Pinned: a change here silently changes every resumed run's augmentation.
    assert sample_seed(0, 0, 0) == 2558736989570252433
    seeds = {sample_seed(7, e, i) for e in range(4) for i in range(1000)}
    assert len(seeds) == 4000 and all(0 <= s < 2**64 for s in seeds)
    assert sample_seed(7, 1, 5) == sample_seed(7, 1, 5) != sample_seed(8, 1, 5)


def test_random_resized_crop_boxes_stay_inside_and_follow_scale():
    fractions, flips = [], 0
    for seed in range(500):
        rng = SampleRandom(sample_seed(1, 0, seed))
        box = random_resized_crop(375, 500, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
        assert 0 <= box.top and box.top + box.height <= 375 and 0 <= box.left and box.left + box.width <= 500
        fractions.append(box.height * box.width / (375 * 500))
        flips += rng.uniform() < 0.5
    assert 0.06 < min(fractions) < 0.15 and max(fractions) > 0.9  # the (0.08, 1) area range is covered
    assert 200 < flips < 300


def test_crop_fallback_for_extreme_aspect_ratios():
    rng = SampleRandom(3)
    box = random_resized_crop(2, 3000, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
    assert box.height == 2 and 1 <= box.width <= 3 and box.left + box.width <= 3000
    assert center_crop(3000, 2, fraction=0.875) == center_crop(3000, 2, fraction=0.875)
    assert center_crop(3000, 2, fraction=0.875).width == 2


@pytest.mark.parametrize("decoder", DECODERS)
def test_eval_is_resize_shorter_side_then_centre_crop(decoder):
    data = _encode(_pixels(200, 400), "PNG")
    dec = CpuDecoder(DecodeConfig(size=100, train=False, crop_fraction=1.0, decoder=decoder))
    out = dec.decode(data, seed=1)
    assert np.array_equal(out, dec.decode(data, seed=999))  # no randomness in eval
    box = center_crop(200, 400, fraction=1.0)
    assert (box.top, box.left, box.height, box.width) == (0, 100, 200, 200)
    # Lossless input: PIL's bilinear resize up to rounding (torch's uint8 resize is built to match it).
    assert np.abs(out.astype(int) - _reference(data, box, 100)).max() <= 1


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("train", [True, False])
def test_reduced_size_decode_matches_full_decode(decoder, train):
    """DCT-scaled decoding of a large JPEG stays within 1.5 grey levels (mean) of full decode + crop."""
    data = _jpeg(1200, 1600)
    cfg = DecodeConfig(size=128, train=train, scale=(0.3, 1.0), decoder=decoder)
    dec, reduced = CpuDecoder(cfg), 0
    for seed in range(6):
        box, flip = dec._plan(1200, 1600, seed)
        reduced += jpeg_scale_denom(1200, 1600, box, 128) > 1
        want = _reference(data, box, 128)
        if flip:
            want = want[:, :, ::-1]
        assert _mean_abs(dec.decode(data, seed=seed), want) < 1.5
    assert reduced >= 5  # the test exercises the reduced path, not just full decodes


def test_scale_denominator_keeps_the_crop_at_least_the_output_size():
    box = center_crop(1200, 1600, fraction=1.0)  # 1200 x 1200
    assert jpeg_scale_denom(1200, 1600, box, 224) == 4  # 300 >= 224; 1/8 would give 150
    assert jpeg_scale_denom(375, 500, center_crop(375, 500, fraction=1.0), 224) == 1


def test_normalize_gives_float_mean_std():
    data = _jpeg(100, 130)
    plain = CpuDecoder(DecodeConfig(size=48)).decode(data, seed=2)
    cfg = DecodeConfig(size=48, normalize=True, mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3))
    normed = CpuDecoder(cfg).decode(data, seed=2)
    want = (plain / 255.0 - np.array(cfg.mean).reshape(3, 1, 1)) / np.array(cfg.std).reshape(3, 1, 1)
    assert normed.dtype == np.float32 and np.allclose(normed, want, atol=1e-5)


def invert(image: torch.Tensor) -> torch.Tensor:
    """A plain per-sample callable, module level so that the decoder stays picklable."""
    return 255 - image


def test_user_transform_is_applied_before_normalize():
    data = _jpeg(100, 130)
    plain = CpuDecoder(DecodeConfig(size=40)).decode(data, seed=4)
    dec = pickle.loads(pickle.dumps(CpuDecoder(DecodeConfig(size=40), transform=invert)))
    assert np.array_equal(dec.decode(data, seed=4), 255 - plain)
    normed = CpuDecoder(DecodeConfig(size=40, normalize=True), transform=invert).decode(data, seed=4)
    assert np.allclose(normed[0], ((255 - plain[0]) / 255 - 0.485) / 0.229, atol=1e-5)
    seen = []
    CpuDecoder(DecodeConfig(size=40), transform=lambda t: seen.append(tuple(t.shape)) or t).decode(data, seed=4)
    assert seen == [(3, 40, 40)]


def test_transform_returning_a_wrong_shape_is_refused():
    dec = CpuDecoder(DecodeConfig(size=40), transform=lambda t: t[:, :10])
    with pytest.raises(ValueError, match="'k1'.*uint8 \\(3, 40, 40\\)"):
        dec.decode(_jpeg(60, 60), seed=0, key="k1")
    with pytest.raises(TypeError):
        CpuDecoder(DecodeConfig(), transform="flip")


def test_decode_batch_fills_one_tensor_in_order():
    items = [_jpeg(80, 100), _encode(_pixels(50, 70), "PNG"), _jpeg(300, 200)]
    dec = CpuDecoder(DecodeConfig(size=32))
    batch = dec.decode_batch(items, seeds=[1, 2, 3], keys=["a", "b", "c"], url=URL)
    assert batch.shape == (3, 3, 32, 32) and batch.dtype == torch.uint8
    for i, data in enumerate(items):
        assert np.array_equal(batch[i].numpy(), dec.decode(data, seed=i + 1))
    with pytest.raises(ValueError, match="same length"):
        dec.decode_batch(items, seeds=[1, 2])
    with pytest.raises(ValueError, match="same length"):
        dec.decode_batch(items, seeds=[1, 2, 3], url=["a", "b"])


def test_decode_batch_names_the_shard_of_the_bad_item():
    """A batch may span shards: the error names the bad item's own URL."""
    dec = CpuDecoder(DecodeConfig(size=32))
    with pytest.raises(CorruptSampleError) as info:
        dec.decode_batch([_jpeg(60, 60), b"junk"], seeds=[0, 1], keys=["a", "b"], url=["s3://x/0.tar", URL])
    assert (info.value.url, info.value.key) == (URL, "b")


@pytest.mark.parametrize("decoder", DECODERS)
def test_any_bytes_like_input(decoder):
    """Samples may arrive as slices of a packed batch buffer rather than bytes objects."""
    dec = CpuDecoder(DecodeConfig(size=32, decoder=decoder))
    for data in (_jpeg(60, 80), _encode(_pixels(60, 80), "PNG")):
        want = dec.decode(data, seed=3)
        packed = np.frombuffer(b"xx" + data, dtype=np.uint8)[2:]
        for view in (bytearray(data), memoryview(data), packed, memoryview(packed)):
            assert np.array_equal(dec.decode(view, seed=3), want)


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("bad", ["garbage", "truncated_jpeg", "truncated_png", "empty", "jpeg_magic_only"])
def test_corrupt_bytes_name_url_and_key(bad, decoder):
    jpeg, png = _jpeg(200, 200), _encode(_pixels(200, 200), "PNG")
    data = {"garbage": b"this is not an image at all", "truncated_jpeg": jpeg[: len(jpeg) // 2],
            "truncated_png": png[: len(png) // 2], "empty": b"", "jpeg_magic_only": b"\xff\xd8\xff"}[bad]
    dec = CpuDecoder(DecodeConfig(size=32, decoder=decoder))
    with pytest.raises(CorruptSampleError) as info:
        dec.decode_batch([jpeg, data], seeds=[0, 1], keys=["good", "000042"], url=URL)
    assert info.value.key == "000042" and info.value.url == URL
    assert "000042" in str(info.value) and URL in str(info.value)


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares width x height, with a few bytes of pixel data: a bomb's header."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def _jpeg_declaring(width: int, height: int) -> bytes:
    """A small real JPEG with its SOF header rewritten to claim width x height."""
    data = bytearray(_jpeg(16, 16))
    pos = 2
    while data[pos + 1] not in (0xC0, 0xC1, 0xC2):  # walk marker segments to the frame header
        pos += 2 + struct.unpack(">H", data[pos + 2 : pos + 4])[0]
    struct.pack_into(">HH", data, pos + 5, height, width)
    return bytes(data)


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("bomb", ["png_50000", "png_12000", "jpeg_60000"])
def test_bomb_headers_are_refused_before_decoding(bomb, decoder):
    data = {"png_50000": _png_header_only(50_000, 50_000), "png_12000": _png_header_only(12_000, 12_000),
            "jpeg_60000": _jpeg_declaring(60_000, 60_000)}[bomb]
    dec = CpuDecoder(DecodeConfig(size=32, decoder=decoder))
    with pytest.warns(Image.DecompressionBombWarning) if bomb == "png_12000" else _no_op():
        with pytest.raises(ImageTooLargeError) as info:  # a full decode would need gigabytes
            dec.decode(data, seed=0, key="bomb", url=URL)
    assert info.value.key == "bomb" and URL in str(info.value)


def test_configured_pixel_limit_applies():
    dec = CpuDecoder(DecodeConfig(size=32, max_pixels=100 * 100))
    with pytest.raises(ImageTooLargeError, match="exceeds the limit"):
        dec.decode(_jpeg(101, 100), seed=0, key="k", url=URL)
    assert dec.decode(_jpeg(100, 100), seed=0).shape == (3, 32, 32)


class _no_op:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("bad", [dict(size=0), dict(size=2.5), dict(scale=(0.5, 0.1)), dict(ratio=(0, 1)),
                                 dict(crop_fraction=1.5), dict(max_pixels=0), dict(std=(0.1, 0, 0.1)),
                                 dict(mean=(0.5,)), dict(decoder="turbo")])
def test_config_validation(bad):
    with pytest.raises(ValueError):
        DecodeConfig(**bad)
    with pytest.raises(TypeError):
        DecodeConfig(sizes=3)  # typo: unknown keys are errors


def test_single_core_rate_helper_runs(tmp_path):
    """The loader benchmark calls this; a smoke run on a few images, no speed asserted."""
    from benchmarks.bench_decode import make_jpegs, single_core_decode_augment_rate

    paths = make_jpegs(tmp_path, 3, width=64, height=48)
    threads = torch.get_num_threads()
    assert single_core_decode_augment_rate(paths, repeats=1) > 0
    assert torch.get_num_threads() == threads  # restored for the caller
