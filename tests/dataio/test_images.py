"""Image checks: the pixel limit stops bombs from the header alone, corrupt data fails clearly, downscale."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from dataio import CorruptSampleError, ImageTooLargeError
from dataio.decode.images import DEFAULT_MAX_PIXELS, downscale, probe, validate

URL, KEY = "s3://bucket/ds/shards/shard-000003.tar", "000042"


def _encode(width: int, height: int, fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(0)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)
    img = Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height but carries no pixel data: what a bomb's header looks like."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


@pytest.mark.parametrize("side", [10_000, 100_000])  # PIL's warning zone, and far past its hard error
def test_bomb_header_is_refused_before_decoding(side):
    with pytest.raises(ImageTooLargeError) as err:
        probe(_png_header_only(side, side), url=URL, key=KEY)
    assert err.value.url == URL and err.value.key == KEY
    assert URL in str(err.value) and KEY in str(err.value)
    assert isinstance(err.value, CorruptSampleError)  # readers that skip corrupt samples skip these too


def test_configured_pixel_limit_applies():
    data = _encode(100, 80)
    assert probe(data) == ("jpeg", 100, 80)
    with pytest.raises(ImageTooLargeError, match=r"100x80 = 8000 pixels exceeds the limit of 5000"):
        probe(data, max_pixels=5000, url=URL, key=KEY)
    with pytest.raises(ImageTooLargeError):
        validate(data, max_pixels=5000)
    with pytest.raises(ImageTooLargeError):
        downscale(data, 50, max_pixels=5000)
    big_but_allowed = _png_header_only(4000, 4000)
    assert probe(big_but_allowed) == ("png", 4000, 4000)
    assert 4000 * 4000 < DEFAULT_MAX_PIXELS


@pytest.mark.parametrize("data", [b"", b"not an image at all", b"\xff\xd8\xff" + b"\x00" * 20])
def test_garbage_is_a_corrupt_sample_naming_url_and_key(data):
    with pytest.raises(CorruptSampleError, match="not a readable image") as err:
        probe(data, url=URL, key=KEY)
    assert URL in str(err.value) and repr(KEY) in str(err.value)


def test_truncated_image_passes_probe_but_fails_validate():
    data = _encode(64, 48)
    cut = data[: len(data) // 2]
    assert probe(cut) == ("jpeg", 64, 48)  # the header is intact
    with pytest.raises(CorruptSampleError, match="does not decode"):
        validate(cut, url=URL, key=KEY)
    with pytest.raises(CorruptSampleError):
        downscale(cut, 16, url=URL, key=KEY)
    assert validate(data) == ("jpeg", 64, 48)


def test_downscale_jpeg_keeps_aspect_and_format():
    out, ext = downscale(_encode(800, 600), 256)
    assert ext == "jpg"
    with Image.open(io.BytesIO(out)) as img:
        assert (img.format, img.size, img.mode) == ("JPEG", (256, 192), "RGB")
    tall, _ = downscale(_encode(90, 300), 100)
    with Image.open(io.BytesIO(tall)) as img:
        assert img.size == (30, 100)


def test_downscale_leaves_small_images_untouched():
    data = _encode(120, 90)
    out, ext = downscale(data, 120)
    assert out is data and ext == "jpg"
    png = _encode(20, 10, "PNG")
    assert downscale(png, 64) == (png, "png")


def test_downscale_png_stays_lossless_with_its_mode():
    out, ext = downscale(_encode(200, 100, "PNG", "RGBA"), 50)
    assert ext == "png"
    with Image.open(io.BytesIO(out)) as img:
        assert (img.format, img.size, img.mode) == ("PNG", (50, 25), "RGBA")
    gray, ext = downscale(_encode(100, 100, "JPEG", "L"), 10)
    with Image.open(io.BytesIO(gray)) as img:
        assert (ext, img.size, img.mode) == ("jpg", (10, 10), "RGB")


def test_a_limit_above_pils_own_warning_threshold_is_honoured():
    # 10000 x 10000 = 100M pixels: above PIL's 89.5M warning threshold, below its hard error.
    data = _png_header_only(10_000, 10_000)
    assert probe(data, max_pixels=200_000_000)[1:] == (10_000, 10_000)
    with pytest.raises(ImageTooLargeError, match="exceeds the limit"):
        probe(data, max_pixels=50_000_000)


def _gif_screen(width: int, height: int) -> bytes:
    """A GIF whose logical screen is width x height, holding one 1x1 image: tiny bytes, huge header."""
    screen = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    return screen + b"," + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00;"


@pytest.mark.slow  # decodes a very large image: seconds
def test_a_limit_above_twice_pils_own_is_honoured_by_writer_and_decoder():
    from dataio.decode.cpu import CpuDecoder, DecodeConfig

    # 15000 x 15000 = 225M pixels: past PIL's hard error (2 x 89.5M), which refused it even when
    # max_pixels allowed it (PIL reads a GIF's size itself: no fast header path).
    data = _gif_screen(15_000, 15_000)
    with pytest.raises(ImageTooLargeError, match="limit of 89478485"):
        probe(data, url=URL, key=KEY)
    assert probe(data, max_pixels=300_000_000) == ("gif", 15_000, 15_000)
    assert validate(data, max_pixels=300_000_000)[1:] == (15_000, 15_000)
    with pytest.raises(ImageTooLargeError):
        CpuDecoder(DecodeConfig(size=8)).decode(data, seed=0, key=KEY, url=URL)
    out = CpuDecoder(DecodeConfig(size=8, max_pixels=300_000_000)).decode(data, seed=0, key=KEY, url=URL)
    assert out.shape[-2:] == (8, 8)
    assert Image.MAX_IMAGE_PIXELS == DEFAULT_MAX_PIXELS  # PIL's global is given back
