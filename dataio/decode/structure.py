"""Structure checks of image files without decoding pixels: the writer's default validation.

Each walker follows a format's own framing to its end marker: JPEG markers and segment lengths
to EOI (with the restart-marker sequence inside scans), PNG chunks with their CRCs to IEND, the
WebP RIFF length and chunks, GIF blocks to the trailer, the BMP and binary PNM pixel-array sizes.
A file cut short anywhere fails its walk, and so does damage to the framing; damage inside
entropy-coded data whose framing survives (a JPEG, WebP or GIF bit flip) needs a decode to be
seen, which `images.validate` (`--validate full`) does. A walk costs tens of microseconds where a
decode costs milliseconds: it is bound by C loops (re, zlib.crc32) over the bytes, not by Python.

`structure_problem(data)` returns None when the walk found the file sound, a sentence saying what
is wrong, or UNCHECKED for formats with no walker here (TIFF, ASCII PNM, compressed BMP, ...),
which the caller then decodes.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

UNCHECKED = "no structure walk for this format"
TRUNCATED = "truncated"

# Inside entropy-coded data 0xFF is followed by 0x00 (stuffing), 0xD0-0xD7 (RSTn) or 0xFF (fill);
# anything else is the marker that ends the scan.
_SCAN_END = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
_RESTART = re.compile(rb"\xff[\xd0-\xd7]")
# SOFn markers carry the frame header (C4 DHT, C8 JPG and CC DAC are not frames).
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNM_WS = b" \t\r\n\x0b\x0c"


def structure_problem(data: Any) -> str | None:
    """None if the image's framing is sound to its end, else what is wrong (or UNCHECKED)."""
    head = bytes(memoryview(data)[:16])
    if head[:2] == b"\xff\xd8":
        return _jpeg(data)
    if head[:8] == _PNG_SIGNATURE:
        return _png(data)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp(data)
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return _gif(data)
    if head[:2] == b"BM":
        return _bmp(data)
    if head[:2] in (b"P4", b"P5", b"P6"):
        return _pnm(data)
    return UNCHECKED


def _jpeg(data: Any) -> str | None:
    """Markers and segment lengths from SOI to EOI; every scan ends at a marker, RSTn in order."""
    size, pos, frame, scans, restarts = len(data), 2, False, 0, False
    while True:
        while pos < size and data[pos] == 0xFF and pos + 1 < size and data[pos + 1] == 0xFF:
            pos += 1  # fill bytes before a marker
        if pos + 2 > size:
            return f"JPEG ends before its EOI marker ({TRUNCATED})"
        if data[pos] != 0xFF:
            return f"JPEG has no marker at byte {pos} (damaged segment lengths)"
        marker = data[pos + 1]
        pos += 2
        if marker == 0xD9:
            return None if scans else "JPEG reaches EOI without any image data"
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:
            continue  # stand-alone markers
        if pos + 2 > size:
            return f"JPEG ends inside a segment header ({TRUNCATED})"
        length = (data[pos] << 8) | data[pos + 1]
        if length < 2 or pos + length > size:
            return f"JPEG segment 0x{marker:02X} runs past the end of the file ({TRUNCATED})"
        if marker in _SOF:
            frame = True
            if length < 8 or length != 8 + 3 * data[pos + 7]:
                return "JPEG frame header is damaged"
        elif marker == 0xDA:
            if not frame:
                return "JPEG scan comes before its frame header"
            scans += 1
            found = _SCAN_END.search(data, pos + length)
            if found is None:
                return f"JPEG scan data runs to the end without EOI ({TRUNCATED})"
            problem = restarts and _restarts_in_order(data, pos + length, found.start())
            if problem:
                return problem
            pos = found.start()
            continue
        elif marker == 0xDD:  # DRI: scans carry RSTn markers (checked only then: a second pass)
            restarts = length >= 4 and (data[pos + 2] or data[pos + 3]) != 0
        elif marker == 0x00 or 0x02 <= marker <= 0xBF:
            return f"JPEG has an invalid marker 0x{marker:02X} at byte {pos - 2}"
        pos += length


def _restarts_in_order(data: Any, start: int, end: int) -> str | None:
    """RST0..RST7 markers in a scan must count up modulo 8: a spliced or shifted scan breaks that."""
    expected = 0
    for found in _RESTART.finditer(data, start, end):
        number = data[found.start() + 1] - 0xD0
        if number != expected:
            return f"JPEG restart markers out of order at byte {found.start()} (damaged scan data)"
        expected = (expected + 1) % 8
    return None


def _png(data: Any) -> str | None:
    """Chunks from IHDR to IEND, each with its CRC-32 (which covers every byte of compressed data)."""
    view, size, pos, seen_idat = memoryview(data), len(data), 8, False
    first = True
    while True:
        if pos + 12 > size:
            return f"PNG ends before its IEND chunk ({TRUNCATED})"
        length = int.from_bytes(view[pos:pos + 4], "big")
        kind = bytes(view[pos + 4:pos + 8])
        end = pos + 12 + length
        if end > size:
            return f"PNG chunk {kind!r} runs past the end of the file ({TRUNCATED})"
        if first and kind != b"IHDR":
            return "PNG does not start with IHDR"
        first = False
        crc = int.from_bytes(view[end - 4:end], "big")
        if zlib.crc32(view[pos + 4:end - 4]) != crc:
            return f"PNG chunk {kind!r} at byte {pos} fails its CRC (damaged data)"
        if kind == b"IDAT":
            seen_idat = True
        elif kind == b"IEND":
            return None if seen_idat else "PNG has no image data (IDAT)"
        pos = end


def _webp(data: Any) -> str | None:
    """The RIFF length covers the file; chunks tile it; the bitstream chunk's own header fits."""
    view, size = memoryview(data), len(data)
    riff_end = 8 + int.from_bytes(view[4:8], "little")
    if riff_end > size:
        return f"WebP is shorter than its RIFF header says ({TRUNCATED})"
    pos, bitstream = 12, False
    while pos < riff_end:
        if pos + 8 > riff_end:
            return "WebP chunk header runs past the RIFF end (damaged chunk sizes)"
        kind, length = bytes(view[pos:pos + 4]), int.from_bytes(view[pos + 4:pos + 8], "little")
        body, pos = pos + 8, pos + 8 + length + (length & 1)  # chunks are padded to even sizes
        if body + length > riff_end:
            return f"WebP chunk {kind!r} runs past the RIFF end ({TRUNCATED} or damaged)"
        if kind == b"VP8 ":
            bitstream = True
            first_partition = int.from_bytes(view[body:body + 3], "little") >> 5
            if length < 10 or bytes(view[body + 3:body + 6]) != b"\x9d\x01\x2a" or 10 + first_partition > length:
                return "WebP VP8 frame header is damaged"
        elif kind == b"VP8L":
            bitstream = True
            if length < 5 or view[body] != 0x2F:
                return "WebP VP8L header is damaged"
        elif kind == b"ANMF":
            bitstream = True
    return None if bitstream else "WebP has no image data (VP8/VP8L/ANMF chunk)"


def _gif(data: Any) -> str | None:
    """Blocks from the screen descriptor to the trailer (0x3B), sub-block lengths followed."""
    size = len(data)
    if size < 13:
        return f"GIF ends inside its header ({TRUNCATED})"
    pos, frames = 13 + _colour_table(data[10]), 0
    while pos < size:
        block = data[pos]
        if block == 0x3B:
            return None if frames else "GIF reaches its trailer without any frame"
        if block == 0x21:  # extension: label, then sub-blocks
            pos = _sub_blocks(data, pos + 2)
        elif block == 0x2C:  # image: descriptor, local colour table, LZW code size, sub-blocks
            if pos + 10 > size:
                break
            pos += 10 + _colour_table(data[pos + 9])
            if pos < size and not 2 <= data[pos] <= 12:
                return f"GIF frame at byte {pos} has an invalid LZW code size (damaged)"
            pos = _sub_blocks(data, pos + 1)
            frames += 1
        else:
            return f"GIF has an unknown block 0x{block:02X} at byte {pos} (damaged)"
    return f"GIF ends before its trailer ({TRUNCATED})"


def _colour_table(flags: int) -> int:
    return 3 << ((flags & 7) + 1) if flags & 0x80 else 0


def _sub_blocks(data: Any, pos: int) -> int:
    """The position after a chain of sub-blocks (past len(data) when the chain is cut short)."""
    size = len(data)
    while pos < size:
        length = data[pos]
        pos += 1 + length
        if length == 0:
            return pos
    return size + 1


def _bmp(data: Any) -> str | None:
    """Uncompressed bitmaps must hold their whole pixel array; compressed ones are decoded instead."""
    view, size = memoryview(data), len(data)
    if size < 26:
        return f"BMP ends inside its header ({TRUNCATED})"
    offset, header = int.from_bytes(view[10:14], "little"), int.from_bytes(view[14:18], "little")
    if header == 12:  # OS/2 core header
        width, height = int.from_bytes(view[18:20], "little"), int.from_bytes(view[20:22], "little")
        bits, compression = int.from_bytes(view[24:26], "little"), 0
    elif header >= 40 and size >= 34:
        width = int.from_bytes(view[18:22], "little", signed=True)
        height = abs(int.from_bytes(view[22:26], "little", signed=True))
        bits, compression = int.from_bytes(view[28:30], "little"), int.from_bytes(view[30:34], "little")
    else:
        return UNCHECKED
    if compression not in (0, 3, 6) or width <= 0 or bits not in (1, 2, 4, 8, 16, 24, 32):
        return UNCHECKED  # RLE, embedded JPEG/PNG, odd headers: the decoder judges
    stride = (width * bits + 31) // 32 * 4
    if offset + stride * height > size:
        return f"BMP is shorter than its {width}x{height} pixel array ({TRUNCATED})"
    return None


def _pnm(data: Any) -> str | None:
    """Binary PBM/PGM/PPM: the header's width, height and maxval fix the pixel array's size."""
    head = bytes(memoryview(data)[:512])
    kind, fields, pos = head[:2], [], 2
    wanted = 2 if kind == b"P4" else 3
    while len(fields) < wanted:
        while pos < len(head) and (head[pos] in _PNM_WS or head[pos] == ord("#")):
            if head[pos] == ord("#"):
                pos = head.find(b"\n", pos)
                if pos < 0:
                    return UNCHECKED
            pos += 1
        start = pos
        while pos < len(head) and head[pos:pos + 1].isdigit():
            pos += 1
        if start == pos:
            return UNCHECKED  # an unusual header: the decoder judges
        fields.append(int(head[start:pos]))
    width, height = fields[0], fields[1]
    if kind == b"P4":
        expected = (width + 7) // 8 * height
    else:
        expected = width * height * (3 if kind == b"P6" else 1) * (2 if fields[2] > 255 else 1)
    if pos + 1 + expected > len(data):
        return f"PNM is shorter than its {width}x{height} pixel array ({TRUNCATED})"
    return None
