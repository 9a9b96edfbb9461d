"""Image-text pairs made locally, with no download: shapes of a colour at a position, each image
captioned with what is drawn ("a red circle on the left"), for tests, the demo and benchmarks.

`write_pair_folder` lays them out as `shardify write --captions` takes a folder (x.jpg + x.txt,
some with x.json alternatives); `write_img2dataset_tars` as img2dataset writes its output (tars of
jpg/txt/json, a parquet of statuses beside each); `write_pair_table` as a table.
"""

from __future__ import annotations

import io
import json
import random
import tarfile
from pathlib import Path

SHAPES = ("circle", "square", "triangle")
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (40, 60, 220)}
PLACES = ("left", "right")
CLASSES = tuple(f"{c} {s}" for c in COLOURS for s in SHAPES)  # what zero-shot classification names


def draw(shape: str, colour: str, place: str, *, size: int = 32, seed: int = 0):  # noqa: ANN201 - a PIL image
    """One image: `shape` in `colour` on the `place` half, on a grey background jittered by `seed`."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    grey = rng.randrange(90, 160)
    img = Image.new("RGB", (size, size), (grey, grey, grey))
    d = ImageDraw.Draw(img)
    r = size // 5 + rng.randrange(0, 3)
    cx = (size // 4 if place == "left" else 3 * size // 4) + rng.randrange(-2, 3)
    cy = size // 2 + rng.randrange(-4, 5)
    box = (cx - r, cy - r, cx + r, cy + r)
    fill = COLOURS[colour]
    if shape == "circle":
        d.ellipse(box, fill=fill)
    elif shape == "square":
        d.rectangle(box, fill=fill)
    else:
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
    return img


def pair(i: int, *, seed: int = 0, size: int = 32) -> tuple[bytes, list[str], int]:
    """(JPEG bytes, captions, class index into CLASSES) of pair number i."""
    rng = random.Random(seed * 1_000_003 + i)
    shape, colour, place = rng.choice(SHAPES), rng.choice(list(COLOURS)), rng.choice(PLACES)
    buf = io.BytesIO()
    draw(shape, colour, place, size=size, seed=rng.randrange(1 << 30)).save(buf, format="JPEG", quality=90)
    captions = [f"a {colour} {shape} on the {place}", f"a photo of a {colour} {shape}",
                f"{colour} {shape}, {place} side"]
    return buf.getvalue(), captions, CLASSES.index(f"{colour} {shape}")


def write_pair_folder(root: Path, n: int, *, seed: int = 0, size: int = 32) -> Path:
    """ROOT/NNNNN.jpg + .txt (the first caption); every third sample lists all its captions in .json."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        data, captions, _ = pair(i, seed=seed, size=size)
        (root / f"{i:05d}.jpg").write_bytes(data)
        (root / f"{i:05d}.txt").write_text(captions[0])
        if i % 3 == 0:
            (root / f"{i:05d}.json").write_text(json.dumps({"captions": captions}))
    return root


def write_img2dataset_tars(root: Path, n: int, *, per_tar: int = 8, seed: int = 0, failed: int = 2) -> Path:
    """img2dataset's layout: 00000.tar (KEY.jpg, KEY.txt, KEY.json), 00000.parquet of statuses (with
    `failed` failed downloads per tar, not in the tar) and 00000_stats.json."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    for t, start in enumerate(range(0, n, per_tar)):
        rows = []
        with tarfile.open(root / f"{t:05d}.tar", "w") as tar:
            for i in range(start, min(n, start + per_tar)):
                data, captions, _ = pair(i, seed=seed)
                key = f"{t:05d}{i - start:04d}"
                meta = json.dumps({"url": f"http://example.invalid/{i}.jpg", "key": key, "status": "success",
                                   "caption": captions[0], "width": 32, "height": 32}).encode()
                for ext, payload in (("jpg", data), ("txt", captions[0].encode()), ("json", meta)):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
                rows.append({"key": key, "status": "success", "error_message": None, "caption": captions[0]})
        rows += [{"key": f"{t:05d}9{j:03d}", "status": "failed_to_download", "error_message": "HTTP 404",
                  "caption": "gone"} for j in range(failed)]
        pq.write_table(pa.Table.from_pylist(rows), root / f"{t:05d}.parquet")
        (root / f"{t:05d}_stats.json").write_text(json.dumps({"count": len(rows), "successes": len(rows) - failed}))
    return root


def write_pair_table(path: Path, n: int, *, seed: int = 0) -> Path:
    """A Parquet table: `image` (JPEG bytes), `caption` (a list of captions) and `id`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for i in range(n):
        data, captions, _ = pair(i, seed=seed)
        rows.append({"image": data, "caption": captions, "id": i})
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_labelled_images(root: Path, per_class: int, *, seed: int = 1, size: int = 32) -> Path:
    """ROOT/CLASS/N.jpg for each of CLASSES ("red circle" -> folder red_circle): the held-out set
    zero-shot validation names by its class folders."""
    rng = random.Random(seed)
    for name in CLASSES:
        colour, shape = name.split()
        folder = root / name.replace(" ", "_")
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            img = draw(shape, colour, rng.choice(PLACES), size=size, seed=rng.randrange(1 << 30))
            img.save(folder / f"{i:04d}.jpg", format="JPEG", quality=90)
    return root
