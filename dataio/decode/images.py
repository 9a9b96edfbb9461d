"""Image checks shared by the writer and the decoders: the one header parser, pixel limit,
validation (structure walk or full decode), downscale.

The pixel limit refuses decompression bombs before any pixel is decoded: the header alone says
how large the image claims to be.
"""

from __future__ import annotations

import contextlib
import io
import re
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import simplejpeg
from PIL import Image

from dataio.decode.structure import UNCHECKED, structure_problem
from dataio.errors import CorruptSampleError, ImageTooLargeError

DEFAULT_MAX_PIXELS = 89_478_485  # PIL's own bomb threshold (~ 9459 x 9459)
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "ppm", "pgm", "tif", "tiff", "gif")
# A sample's image is whichever image field it has (WebDataset's "jpg;png;webp"); a sample with
# several is decoded from the first present in this order (IMAGE_EXTS' order), then any other
# image-typed field of the manifest (e.g. a Hugging Face `image` column) in manifest order.
IMAGE_FIELD_ORDER = IMAGE_EXTS
JPEG_MAGIC = b"\xff\xd8"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# simplejpeg's colour space names -> PIL's mode names, so both paths speak one vocabulary.
_JPEG_MODES = {"YCbCr": "RGB", "RGB": "RGB", "Gray": "L", "CMYK": "CMYK", "YCCK": "CMYK"}
# PNG IHDR colour type -> PIL's mode at 8 bits; 16-bit images get their own names (not 8-bit RGB).
_PNG_MODES = {0: "L", 2: "RGB", 3: "P", 4: "LA", 6: "RGBA"}
_PNG_MODES_16 = {0: "I;16", 2: "RGB;16", 4: "LA;16", 6: "RGBA;16"}


_PIL_LIMIT_LOCK = threading.Lock()


@contextlib.contextmanager
def pil_pixel_limit(max_pixels: int) -> Iterator[None]:
    """PIL's own bomb check (Image.open refuses above twice Image.MAX_IMAGE_PIXELS) raised to
    `max_pixels` while inside, so a limit raised above PIL's default is ours to enforce, not PIL's.

    Below PIL's threshold nothing changes (ours fires first). Above it the change is process-wide,
    so holders take a lock, and the old value comes back on exit."""
    if max_pixels <= DEFAULT_MAX_PIXELS:
        yield
        return
    with _PIL_LIMIT_LOCK:
        old = Image.MAX_IMAGE_PIXELS
        if old is not None and old < max_pixels:
            Image.MAX_IMAGE_PIXELS = max_pixels  # PIL warns above this and refuses above twice it
        try:
            yield
        finally:
            Image.MAX_IMAGE_PIXELS = old


def order_image_fields(names: Any) -> tuple[str, ...]:
    """Image field names in the documented order: IMAGE_FIELD_ORDER first, the others as given."""
    names = list(dict.fromkeys(names))
    return tuple([n for n in IMAGE_FIELD_ORDER if n in names] + [n for n in names if n not in IMAGE_FIELD_ORDER])


def pick_image(sample: Any, fields: tuple[str, ...]) -> tuple[str, Any] | None:
    """(field, bytes) of the sample's image: the first of `fields` (ordered) holding non-empty bytes."""
    for name in fields:
        value = sample.get(name)
        if isinstance(value, (bytes, bytearray, memoryview)) and len(value):
            return name, value
    return None


@dataclass(frozen=True, slots=True)
class ImageHeader:
    """What an image's header says: PIL's format and mode names (lower-case format), its size."""

    format: str
    mode: str
    width: int
    height: int


def jpeg_header(data: Any) -> tuple[int, int, str] | None:
    """(height, width, simplejpeg colour space) of a JPEG in microseconds; None if not readable so."""
    if bytes(memoryview(data)[:2]) != JPEG_MAGIC:
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except (ValueError, TypeError):
        return None
    return height, width, colorspace


def read_header(data: Any, *, fast_only: bool = False) -> ImageHeader | None:
    """The header of any image: JPEG and PNG parsed directly (~50x faster than PIL), the rest by PIL.

    None when the header cannot be read (or, with fast_only, when it is not a JPEG or PNG): the
    caller then lets a full decode or `probe` report the problem with the file and key.
    """
    head = bytes(memoryview(data)[:32])
    if head[:2] == JPEG_MAGIC:
        found = jpeg_header(data)
        if found is not None:
            height, width, colorspace = found
            return ImageHeader("jpeg", _JPEG_MODES.get(colorspace, colorspace), width, height)
    elif head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR" and len(head) >= 26:
        width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
        depth, color_type = head[24], head[25]
        modes = _PNG_MODES_16 if depth == 16 else _PNG_MODES
        if color_type in modes:
            return ImageHeader("png", modes[color_type], width, height)
    if fast_only:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the pixel limit is ours
            with Image.open(io.BytesIO(bytes(data))) as img:
                return ImageHeader((img.format or "").lower(), img.mode, img.size[0], img.size[1])
    except Exception:  # noqa: BLE001 - PIL raises many types for bad data; a decode names it
        return None


def probe(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, url: str = "", key: str = "") -> tuple[str, int, int]:
    """(format, width, height) from the header only; raises CorruptSampleError / ImageTooLargeError."""
    if not data:
        raise CorruptSampleError(f"{url}: sample {key!r}: not a readable image: it is empty (0 bytes); "
                                 "re-export it or write with --on-error skip", url=url, key=key)
    try:
        with warnings.catch_warnings():
            # PIL's warning threshold is its own global; our max_pixels decides below.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with pil_pixel_limit(max_pixels), Image.open(io.BytesIO(data)) as img:
                width, height = img.size
                fmt = (img.format or "").lower()
    except Image.DecompressionBombError:
        raise ImageTooLargeError(
            f"{url}: sample {key!r}: image declares more than twice the pixel limit of {max_pixels} "
            "(decompression bomb?); refusing to decode it; raise max_pixels (--max-pixels) only if you "
            "trust this data", url=url, key=key,
        ) from None
    except Exception as exc:  # noqa: BLE001 - PIL raises many types for bad data
        raise CorruptSampleError(
            f"{url}: sample {key!r}: not a readable image ({_describe(exc)}); "
            "re-export it or write with --on-error skip", url=url, key=key
        ) from None
    check_pixels(width, height, max_pixels=max_pixels, url=url, key=key)
    return fmt, width, height


def _describe(exc: Exception) -> str:
    """PIL's message without the in-memory file's repr (`<_io.BytesIO object at 0x...>`)."""
    text = re.sub(r" ?<_io\.BytesIO object at 0x[0-9a-f]+>", "", str(exc))
    return f"{type(exc).__name__}: {text}"


def check_pixels(width: int, height: int, *, max_pixels: int, url: str = "", key: str = "") -> None:
    if width * height > max_pixels:
        raise ImageTooLargeError(
            f"{url}: sample {key!r}: image of {width}x{height} = {width * height} pixels exceeds the "
            f"limit of {max_pixels}; raise max_pixels only if you trust this data",
            url=url, key=key,
        )


def validate(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, url: str = "", key: str = "") -> tuple[str, int, int]:
    """Probe, then decode every pixel (a truncated or corrupt file fails here); returns the probe."""
    fmt, width, height = probe(data, max_pixels=max_pixels, url=url, key=key)
    if fmt == "jpeg" and _jpeg_decodes(data):
        return fmt, width, height
    try:  # PIL is the judge: formats and JPEG variants simplejpeg does not take (CMYK, ...)
        with pil_pixel_limit(max_pixels), Image.open(io.BytesIO(data)) as img:
            img.load()
    except Exception as exc:  # noqa: BLE001
        raise CorruptSampleError(
            f"{url}: sample {key!r}: image does not decode ({type(exc).__name__}: {exc})", url=url, key=key
        ) from None
    return fmt, width, height


def check_structure(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, url: str = "", key: str = "") -> None:
    """The writer's default check: pixel limit from the header, then a walk of the file's framing.

    Truncation anywhere and damaged framing are caught without decoding (see structure.py). Only
    files the walk cannot vouch for are decoded (`validate`), which then judges: a format with no
    walker, or a file whose walk found a problem that a decoder may still accept (a JPEG cut just
    before EOI decodes). So this refuses nothing that `validate` accepts.
    """
    header = read_header(data, fast_only=True)
    if header is None:  # not JPEG/PNG, or a header the fast path cannot read: PIL decides
        probe(data, max_pixels=max_pixels, url=url, key=key)
    else:
        check_pixels(header.width, header.height, max_pixels=max_pixels, url=url, key=key)
    problem = structure_problem(data)
    if problem is None:
        return
    try:
        validate(data, max_pixels=max_pixels, url=url, key=key)
    except CorruptSampleError as exc:
        if problem == UNCHECKED:
            raise
        raise CorruptSampleError(f"{exc}; {problem}", url=url, key=key) from None


def _jpeg_decodes(data: bytes) -> bool:
    """True if libjpeg-turbo decodes every entropy-coded block (at 1/8 scale: ~1.8x PIL's speed).

    A truncated or corrupt stream fails here as it does at full size: the scale only skips
    inverse-DCT work, never the Huffman decoding that finds the damage (strict mode).
    """
    try:
        simplejpeg.decode_jpeg(data, fastdct=True, fastupsample=True, min_height=1, min_width=1, strict=True)
    except (ValueError, TypeError):
        return False
    return True


def downscale(data: bytes, max_side: int, *, max_pixels: int = DEFAULT_MAX_PIXELS, url: str = "", key: str = "") -> tuple[bytes, str]:
    """Shrink so the longer side is at most `max_side` (aspect kept); returns (bytes, ext).

    Images already small enough come back unchanged (no re-encode). JPEGs are re-encoded as JPEG
    (quality 95), everything else as PNG (lossless).
    """
    fmt, width, height = probe(data, max_pixels=max_pixels, url=url, key=key)
    ext = "jpg" if fmt in ("jpeg", "jpg", "mpo") else (fmt or "png")
    if max(width, height) <= max_side:
        return data, ext
    scale = max_side / max(width, height)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    try:
        with pil_pixel_limit(max_pixels), Image.open(io.BytesIO(data)) as img:
            img.draft("RGB", size)  # JPEG: decode at a reduced DCT scale first
            out = img.convert("RGB" if ext == "jpg" else img.mode).resize(size, Image.Resampling.LANCZOS)
    except Exception as exc:  # noqa: BLE001
        raise CorruptSampleError(
            f"{url}: sample {key!r}: image does not decode ({type(exc).__name__}: {exc})", url=url, key=key
        ) from None
    buf = io.BytesIO()
    if ext == "jpg":
        out.save(buf, format="JPEG", quality=95)
        return buf.getvalue(), "jpg"
    out.save(buf, format="PNG")
    return buf.getvalue(), "png"
