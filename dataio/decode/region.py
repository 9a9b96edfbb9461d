"""Region decode of JPEG crops: only the iMCU-aligned region covering the crop window is decoded.

The C extension dataio.decode._region (built by `make setup` against libjpeg-turbo) skips the rows
above the window (jpeg_skip_scanlines), decodes only the columns around it (jpeg_crop_scanline) and
stops after its last row; the entropy decoding of baseline JPEGs, which no region decode can skip
above the window's bottom, goes through the extension's own Huffman decoder (_fasthuff.h: the same
coefficients as libjpeg's, ~22% less time). Where the extension is not built, CpuDecoder uses simplejpeg as before
and `warn_unavailable_once` says so, once per process.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np

try:
    from dataio.decode import _region
except ImportError as exc:  # not built (no libjpeg-turbo headers), or built for another Python
    _region = None
    _LOAD_ERROR: str = f"{type(exc).__name__}: {exc}"
else:
    _LOAD_ERROR = ""

_WARNED = threading.Event()
HOW_TO_BUILD = ("install libjpeg-turbo's headers (Debian/Ubuntu: apt-get install libjpeg62-turbo-dev) and run "
                "`make setup` (or `python setup.py build_ext --inplace`)")


def available() -> bool:
    """True when the region decoder loaded in this process."""
    return _region is not None


def why_unavailable() -> str:
    """Why the extension did not load ('' when it did)."""
    return _LOAD_ERROR


def warn_unavailable_once() -> None:
    """One warning per process that JPEG crops decode whole (simplejpeg), and how to build the extension."""
    if _region is None and not _WARNED.is_set():
        _WARNED.set()
        warnings.warn(f"dataio: JPEG region decode is not available ({_LOAD_ERROR}); decoding whole images with "
                      f"simplejpeg instead, which is slower for crops; to enable it, {HOW_TO_BUILD}",
                      RuntimeWarning, stacklevel=3)


def decode_window(data: bytes, *, denom: int, window: tuple[int, int, int, int],
                  scaled_hw: tuple[int, int]) -> np.ndarray | None:
    """(H, W, 3) uint8 pixels of `window` (left, top, right, bottom) of the JPEG decoded at 1/denom,
    whose size is `scaled_hw`; None when libjpeg refuses or warns (corrupt data: let the caller's
    usual decoder give its usual error)."""
    x0, y0, x1, y1 = window
    try:
        buf = _region.decode(data, denom, x0, y0, x1, y1, scaled_hw[1], scaled_hw[0])
    except ValueError:
        return None
    # (y1 - y0, x1 - x0, 3) view of the bytearray: writable, so torch.from_numpy accepts it.
    return np.frombuffer(buf, dtype=np.uint8).reshape(y1 - y0, x1 - x0, 3)


def set_fast_entropy(enabled: bool) -> bool:
    """Decode baseline JPEGs' entropy-coded data with the extension's Huffman decoder (True, the
    default) or libjpeg's own (False: benchmarks and parity tests compare the two); returns the
    previous setting. Process-wide; False where the extension predates it."""
    if _region is None or not hasattr(_region, "set_fast_huffman"):
        return False
    return bool(_region.set_fast_huffman(bool(enabled)))


def fast_entropy_decodes() -> int:
    """How many decodes in this process took the fast Huffman decoder (0 without it)."""
    return _region.fast_huffman_decodes() if _region is not None and hasattr(_region, "fast_huffman_decodes") else 0


def has_planes() -> bool:
    """True when the loaded extension has to_planes (a build older than it decodes regions only:
    `make setup` rebuilds it)."""
    return hasattr(_region, "to_planes")


def to_planes(hwc: np.ndarray, out: np.ndarray, *, flip: bool) -> None:
    """Contiguous (H, W, 3) uint8 -> the contiguous (3, H, W) uint8 `out`, mirrored left-right if
    flip: the layout change after the resize, in C (5 us; torch's or numpy's strided copy ~35-45)."""
    height, width = hwc.shape[:2]
    _region.to_planes(hwc, out, height, width, flip)
