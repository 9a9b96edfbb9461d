"""Images of every format and colour mode a real folder mixes, each a solid colour whose RGB uint8
result is known: JPEG (RGB, grey, CMYK), PNG (RGB, RGBA, palette, grey+alpha, 16-bit grey/RGB),
WebP, BMP, PPM, PGM, TIFF (incl. 16-bit), GIF (first frame of two). Made with PIL and by hand (PNG
16-bit, which PIL does not write), no download."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

SIZE = (20, 16)  # width, height
JPEG_TOLERANCE = 8  # grey levels: JPEG chroma subsampling / CMYK round trips of a solid colour


def png16(arr: np.ndarray) -> bytes:
    """(H, W) or (H, W, C) uint16 -> a 16-bit PNG (grey, grey+alpha, RGB or RGBA)."""
    a = np.asarray(arr, dtype=">u2")
    if a.ndim == 2:
        a = a[:, :, None]
    h, w, c = a.shape
    color_type = {1: 0, 2: 4, 3: 2, 4: 6}[c]
    raw = b"".join(b"\0" + a[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def _save(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _gif_two_frames() -> bytes:
    first = Image.new("RGB", SIZE, (255, 0, 0)).convert("P")
    second = Image.new("RGB", SIZE, (0, 0, 255)).convert("P")
    return _save(first, "GIF", save_all=True, append_images=[second])


def mixed_images() -> dict[str, tuple[str, bytes, tuple[int, int, int], int]]:
    """name -> (extension, bytes, expected RGB after decode, tolerance in grey levels)."""
    h, w = SIZE[1], SIZE[0]
    rgb = Image.new("RGB", SIZE, (200, 100, 50))
    cmyk = Image.new("CMYK", SIZE, (0, 128, 200, 55))
    cmyk_rgb = tuple(int(v) for v in np.asarray(Image.open(io.BytesIO(_save(cmyk, "JPEG", quality=95))).convert("RGB"))[0, 0])
    rgba = Image.new("RGBA", SIZE, (200, 100, 50, 128))
    palette = Image.new("RGB", SIZE, (10, 200, 30)).convert("P", palette=Image.Palette.ADAPTIVE)
    la = Image.new("LA", SIZE, (180, 64))
    half = (100, 50, 25)  # (200, 100, 50) at alpha 128 over black: v * 128 / 255, rounded
    return {
        "jpeg_rgb": ("jpg", _save(rgb, "JPEG", quality=95), (200, 100, 50), JPEG_TOLERANCE),
        "jpeg_grey": ("jpeg", _save(Image.new("L", SIZE, 90), "JPEG", quality=95), (90, 90, 90), JPEG_TOLERANCE),
        "jpeg_cmyk": ("jpg", _save(cmyk, "JPEG", quality=95), cmyk_rgb, JPEG_TOLERANCE),
        "png_rgb": ("png", _save(rgb, "PNG"), (200, 100, 50), 0),
        "png_rgba": ("png", _save(rgba, "PNG"), half, 1),
        "png_palette": ("png", _save(palette, "PNG"), (10, 200, 30), 2),
        "png_grey_alpha": ("png", _save(la, "PNG"), (45, 45, 45), 1),  # 180 * 64 / 255
        "png16_grey": ("png", png16(np.full((h, w), 0x8040, np.uint16)), (128, 128, 128), 0),
        "png16_rgb": ("png", png16(np.dstack([np.full((h, w), v << 8, np.uint16) for v in (200, 100, 50)])),
                      (200, 100, 50), 0),
        "webp": ("webp", _save(rgb, "WEBP", lossless=True), (200, 100, 50), 0),
        "bmp": ("bmp", _save(rgb, "BMP"), (200, 100, 50), 0),
        "ppm": ("ppm", _save(rgb, "PPM"), (200, 100, 50), 0),
        "pgm": ("pgm", _save(Image.new("L", SIZE, 77), "PPM"), (77, 77, 77), 0),
        "tiff": ("tif", _save(rgb, "TIFF"), (200, 100, 50), 0),
        "tiff16": ("tiff", _save(Image.fromarray(np.full((h, w), 0x4000, np.uint16)), "TIFF"), (64, 64, 64), 0),
        "gif": ("gif", _gif_two_frames(), (255, 0, 0), 0),  # the first frame
    }


def write_mixed_folder(root: Path, *, copies: int = 2) -> dict[str, tuple[int, int, int]]:
    """ROOT/CLASS/NAME_i.EXT for every mixed image (class = the image's name): relative path -> expected RGB."""
    expected = {}
    for name, (ext, data, colour, _) in mixed_images().items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(copies):
            rel = f"{name}/{name}_{i}.{ext}"
            (root / rel).write_bytes(data)
            expected[rel] = colour
    return expected


def photo(i: int, size: tuple[int, int] = (320, 240), fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    """A photo-like image (smooth gradients, texture, noise; seeded by i): resize filters matter as on
    real data. The DALI and GPU decode tests compare decoders on these."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = np.random.default_rng(i)
    chans = [np.sin(x / (9 + 20 * r.random()) + c) * np.cos(y / (7 + 25 * r.random())) for c in range(3)]
    arr = (np.stack(chans, -1) * 0.5 + 0.5) * 255 + r.normal(0, 6, (h, w, 3))
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).convert(mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()
