"""The region decoder's own Huffman decoder (dataio/decode/_fasthuff.h): the same pixels as libjpeg's
entropy decoder on every kind of baseline JPEG, the same refusals on corrupt data, libjpeg's decoder
kept where it does not apply, and one state per thread."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
import torch
import simplejpeg

from dataio.decode import region
from dataio.decode.cpu import CpuDecoder, DecodeConfig
from tests.dataio.test_decode_cpu import _encode, _pixels

pytestmark = pytest.mark.skipif(not region.available() or not hasattr(region._region, "set_fast_huffman"),
                                reason=f"region decode not built: {region.why_unavailable()}")


@contextlib.contextmanager
def _entropy(fast: bool):
    before = region.set_fast_entropy(fast)
    try:
        yield
    finally:
        region.set_fast_entropy(before)


def _image(height: int, width: int, *, noise: float, seed: int = 0, mode: str | None = None, **kw) -> bytes:
    arr = _pixels(height, width, seed=seed).astype(np.float32)
    arr += np.random.default_rng(seed).normal(0, noise, arr.shape)
    return _encode(np.clip(arr, 0, 255).astype(np.uint8), "JPEG", mode=mode, **kw)


# Baseline encodings that stress different codes: low and top quality (large coefficients, long extra
# bits), heavy noise (codes past the 12-bit table), optimized tables (long codes, other tables per
# image), every chroma layout, greyscale, sizes that are not whole MCUs.
BASELINE = {
    "q90_420": dict(height=96, width=128, noise=18, quality=90, subsampling=2),
    "q100_444_noise": dict(height=64, width=80, noise=60, quality=100, subsampling=0),
    "q5_422": dict(height=72, width=104, noise=10, quality=5, subsampling=1),
    "q75_optimized": dict(height=88, width=120, noise=30, quality=75, optimize=True),
    "q95_gray_noise": dict(height=70, width=90, noise=80, quality=95, mode="L"),
    "odd_17x9": dict(height=9, width=17, noise=40, quality=97, subsampling=2),
    "one_pixel": dict(height=1, width=1, noise=0, quality=90),
    "tall_7x250": dict(height=250, width=7, noise=25, quality=85, subsampling=2),
    "restart_every_3_mcus": dict(height=64, width=120, noise=30, quality=90, restart_marker_blocks=3),
    "restart_every_row": dict(height=72, width=96, noise=20, quality=85, subsampling=0, restart_marker_rows=1),
}


def _windows(data: bytes, denom: int, count: int, seed: int) -> list[tuple[int, int, int, int]]:
    height, width = simplejpeg.decode_jpeg_header(data)[:2]
    h, w = -(-height // denom), -(-width // denom)
    rng = np.random.default_rng(seed)
    wins = [(0, 0, w, h), (w - 1, h - 1, w, h), (0, h - 1, w, h)]
    for _ in range(count):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        wins.append((x0, y0, int(rng.integers(x0 + 1, w + 1)), int(rng.integers(y0 + 1, h + 1))))
    return wins


def _decode_all(data: bytes, denom: int, wins) -> list[bytes | str]:
    out = []
    for win in wins:
        try:
            out.append(bytes(region._region.decode(data, denom, *win)))
        except ValueError as exc:
            out.append(f"ValueError: {exc}")
    return out


@pytest.mark.parametrize("name", BASELINE)
@pytest.mark.parametrize("denom", [1, 2, 8])
def test_fast_entropy_decoder_gives_libjpegs_pixels(name, denom):
    """Every window at every scale: bit for bit the bytes libjpeg's own entropy decoder gives."""
    spec = dict(BASELINE[name])
    data = _image(spec.pop("height"), spec.pop("width"), noise=spec.pop("noise"), **spec)
    wins = _windows(data, denom, 12, seed=denom)
    with _entropy(False):
        expected = _decode_all(data, denom, wins)
    before = region.fast_entropy_decodes()
    with _entropy(True):
        got = _decode_all(data, denom, wins)
    assert got == expected
    assert all(isinstance(x, bytes) for x in got)
    assert region.fast_entropy_decodes() - before == len(wins)  # it did take the fast decoder


def test_libjpegs_decoder_stays_where_the_fast_one_does_not_apply():
    """Progressive scans keep libjpeg's entropy decoder (same pixels as before)."""
    data = _image(64, 96, noise=20, quality=90, progressive=True)
    wins = _windows(data, 1, 6, seed=3)
    with _entropy(False):
        expected = _decode_all(data, 1, wins)
    before = region.fast_entropy_decodes()
    with _entropy(True):
        assert _decode_all(data, 1, wins) == expected
    assert region.fast_entropy_decodes() == before


def _entropy_start(data: bytes) -> int:
    """Offset of the first entropy-coded byte (after the SOS segment)."""
    sos = data.index(b"\xff\xda")
    return sos + 2 + int.from_bytes(data[sos + 2:sos + 4], "big")


def _corrupted(data: bytes, rng: np.random.Generator) -> list[bytes]:
    start = _entropy_start(data)
    variants = []
    for _ in range(60):
        pos = int(rng.integers(start, len(data) - 2))
        flipped = bytearray(data)
        flipped[pos] ^= 1 << int(rng.integers(0, 8))
        variants.append(bytes(flipped))
    for marker in (b"\xff\xd0", b"\xff\xd3", b"\xff\xd9", b"\xff\xc4"):  # stray RSTs, EOI, DHT in the data
        pos = int(rng.integers(start, len(data) - 2))
        variants.append(data[:pos] + marker + data[pos:])
    return variants


@pytest.mark.parametrize("restarts", [0, 2])
def test_damaged_data_decodes_as_libjpeg_or_fails(restarts):
    """Flipped bytes and stray markers, with and without restart intervals: where both entropy
    decoders decode, the pixels are the same; the fast one fails at least as often as one in 20."""
    data = _image(64, 96, noise=25, quality=92, subsampling=2, restart_marker_blocks=restarts)
    wins, failures, variants = [(0, 0, 96, 64), (10, 20, 50, 40)], 0, _corrupted(data, np.random.default_rng(7))
    for variant in variants:
        with _entropy(False):
            expected = _decode_all(variant, 1, wins)
        with _entropy(True):
            got = _decode_all(variant, 1, wins)
        for a, b in zip(expected, got):
            assert a == b or not (isinstance(a, bytes) and isinstance(b, bytes))
        failures += any(isinstance(x, str) for x in got)
    assert failures >= len(variants) // 20  # the damage does reach the error paths


@pytest.mark.parametrize("restarts", [0, 2])
def test_a_cut_jpeg_is_refused_whatever_the_window(restarts):
    """A JPEG cut anywhere in its data (no EOI) fails for every window, the top row's included,
    with libjpeg's message: whether a cut file trains must not depend on the crop drawn."""
    data = _image(64, 96, noise=25, quality=92, subsampling=2, restart_marker_blocks=restarts)
    start = _entropy_start(data)
    for cut in (start + 1, start + 100, len(data) // 2, len(data) - 3, len(data) - 1):
        with _entropy(True):
            got = _decode_all(data[:cut], 1, [(0, 0, 96, 64), (0, 0, 8, 1), (40, 0, 41, 2)])
        assert got == ["ValueError: Premature end of JPEG file"] * 3, cut
    trailer = data + b"trailing bytes after EOI, as some cameras write"
    with _entropy(False):
        expected = _decode_all(trailer, 1, [(0, 0, 96, 64)])
    with _entropy(True):
        assert _decode_all(trailer, 1, [(0, 0, 96, 64)]) == expected and isinstance(expected[0], bytes)


def test_each_thread_decodes_with_its_own_state():
    """Decodes in parallel threads (GIL released), with different tables in turn, give the serial bytes."""
    images = [_image(80, 112, noise=n, seed=i, quality=q, optimize=opt)
              for i, (n, q, opt) in enumerate([(10, 90, False), (50, 97, True), (30, 60, True), (5, 99, False)])]
    jobs = [(data, win) for data in images for win in _windows(data, 1, 8, seed=1)]
    expected = [bytes(region._region.decode(d, 1, *w)) for d, w in jobs]
    results: dict[int, list[bytes]] = {}

    def run(t: int) -> None:
        order = list(range(len(jobs)))
        order = order[t:] + order[:t] if t % 2 == 0 else order[::-1]  # each thread its own order
        results[t] = {i: bytes(region._region.decode(jobs[i][0], 1, *jobs[i][1])) for i in order * 3}

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for got in results.values():
        assert [got[i] for i in range(len(jobs))] == expected


def test_decoder_batches_are_the_same_with_either_entropy_decoder():
    """The loader's decode (RandomResizedCrop + flip, and centre crop) is bit for bit unchanged."""
    items = [_image(120 + 8 * i, 160 - 4 * i, noise=15 + 5 * i, seed=i, quality=88) for i in range(6)]
    for train in (True, False):
        decoder = CpuDecoder(DecodeConfig(size=32, train=train, decoder="region"))
        with _entropy(False):
            expected = decoder.decode_batch(items, seeds=list(range(6)))
        with _entropy(True):
            got = decoder.decode_batch(items, seeds=list(range(6)))
        assert torch.equal(got, expected)
