"""The writer's default check (structure walk, decode only where the walk cannot vouch) catches
truncated and damaged images of every format the writer accepts, and refuses nothing a full
decode accepts."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from PIL import Image

from dataio.decode.images import check_structure, validate
from dataio.decode.structure import UNCHECKED, structure_problem
from dataio.errors import CorruptSampleError, ImageTooLargeError

URL, KEY = "/data/cat/x", "000007"
CUTS = (0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.97)


def _picture(width: int = 120, height: int = 90) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    rng = np.random.default_rng(0)
    waves = np.stack([np.sin(x / (7 + c) + c) * np.cos(y / 11) for c in range(3)], -1) * 100 + 128
    return Image.fromarray((waves + rng.normal(0, 6, waves.shape)).clip(0, 255).astype(np.uint8))


def _encode(name: str) -> bytes:
    fmt, options = {
        "jpeg": ("JPEG", {"quality": 90}),
        "jpeg-progressive": ("JPEG", {"quality": 90, "progressive": True}),
        "jpeg-restarts": ("JPEG", {"quality": 90, "restart_marker_blocks": 2}),
        "png": ("PNG", {}), "png-16bit": ("PNG", {}),
        "webp": ("WEBP", {"quality": 80}), "webp-lossless": ("WEBP", {"lossless": True}),
        "gif": ("GIF", {}), "bmp": ("BMP", {}), "ppm": ("PPM", {}), "pgm": ("PPM", {}),
        "tiff": ("TIFF", {}),
    }[name]
    img = _picture()
    if name == "gif":
        img = img.convert("P")
    elif name == "pgm":
        img = img.convert("L")
    elif name == "png-16bit":
        img = Image.fromarray(np.asarray(img.convert("L"), dtype=np.uint16) * 257)
    buf = io.BytesIO()
    img.save(buf, format=fmt, **options)
    return buf.getvalue()


FORMATS = ["jpeg", "jpeg-progressive", "jpeg-restarts", "png", "png-16bit", "webp", "webp-lossless",
           "gif", "bmp", "ppm", "pgm", "tiff"]
WALKED = [f for f in FORMATS if f != "tiff"]


@pytest.mark.parametrize("name", FORMATS)
def test_sound_images_pass(name):
    data = _encode(name)
    expected = UNCHECKED if name == "tiff" else None
    assert structure_problem(data) == expected
    check_structure(data, url=URL, key=KEY)
    if name == "jpeg-restarts":
        assert b"\xff\xdd" in data and b"\xff\xd1" in data  # the restart path is exercised


@pytest.mark.parametrize("name", WALKED)
@pytest.mark.parametrize("cut", CUTS)
def test_truncation_is_seen_by_the_walk_alone(name, cut):
    """No decode needed: every walk follows the framing to an end marker or a declared size."""
    data = _encode(name)
    assert structure_problem(data[: int(len(data) * cut)]) is not None


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("cut", CUTS)
def test_default_check_refuses_truncated_files(name, cut):
    data = _encode(name)
    with pytest.raises(CorruptSampleError) as err:
        check_structure(data[: int(len(data) * cut)], url=URL, key=KEY)
    assert URL in str(err.value) and repr(KEY) in str(err.value)


def _garbage_over_middle(data: bytes, seed: int, length: int = 256) -> bytes:
    rng = random.Random(seed)
    start = len(data) // 2 - length // 2
    return data[:start] + rng.randbytes(length) + data[start + length:]


def _flip(data: bytes, where: int) -> bytes:
    out = bytearray(data)
    out[where] ^= 0x55
    return bytes(out)


def _damaged(name: str, data: bytes) -> list[bytes]:
    """Framing damage each walk must see (pixel bytes of BMP/PPM have no framing to damage).

    A JPEG scan's damage shows in its framing only where it forges a marker (0xFF then neither 0x00
    nor RSTn): a 2 KB splice of garbage almost surely does, a single flipped bit almost never, and
    only a decode (--validate full) sees that.
    """
    if name.startswith("jpeg"):
        dqt = data.index(b"\xff\xdb")
        return [_garbage_over_middle(data, s, 2048) for s in range(4)] + [_flip(data, dqt + 3)]
    if name.startswith("png"):
        return [_flip(data, w) for w in (20, len(data) // 2, len(data) - 20)]
    if name.startswith("webp"):
        return [_flip(data, 5), _flip(data, 17)]  # the RIFF size, the first chunk's size
    if name == "gif":
        return [_garbage_over_middle(data, s) for s in range(4)]
    return []


@pytest.mark.parametrize("name", WALKED)
def test_damaged_framing_is_caught(name):
    for bad in _damaged(name, _encode(name)):
        assert structure_problem(bad) is not None
        with pytest.raises(CorruptSampleError):
            check_structure(bad, url=URL, key=KEY)


@pytest.mark.parametrize("name", FORMATS)
def test_default_refuses_nothing_that_a_full_decode_accepts(name):
    """Where the walk objects, the decoder judges: a JPEG missing only its EOI decodes, so it passes."""
    data = _encode(name)
    for bad in [data[:-1], data[:-2], *(data[: int(len(data) * c)] for c in CUTS), *_damaged(name, data)]:
        try:
            validate(bad)
        except CorruptSampleError:
            continue
        check_structure(bad)  # full accepted it: the default must too


def test_pixel_limit_applies_before_the_walk():
    with pytest.raises(ImageTooLargeError):
        check_structure(_encode("gif"), max_pixels=1000, url=URL, key=KEY)
    with pytest.raises(ImageTooLargeError):
        check_structure(_encode("jpeg"), max_pixels=1000, url=URL, key=KEY)


def test_message_says_what_the_walk_found():
    data = _encode("jpeg")
    with pytest.raises(CorruptSampleError, match=r"does not decode.*scan data runs to the end without EOI"):
        check_structure(data[: len(data) // 2], url=URL, key=KEY)
