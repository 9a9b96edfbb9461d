"""The loader benchmark's data: a synthetic ImageNet-like folder, its 4x twin, tar shards of both,
the same images as two half datasets (the mixture rows), and the page-cache ceiling's reader.
Everything is made once and cached under the work folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

DEFAULT_QUALITY = 88  # tools.make_synthetic's: ~100 KB JPEGs; 78 gives ~74 KB


def shardify(src: Path, dest: str, env: dict[str, str] | None = None) -> None:
    shardify = str(Path(sys.executable).parent / "shardify")
    cmd = [shardify, "write", str(src), dest, "--format", "tar", "--shard-size", "64MB",
           "--shuffle", "--seed", "0", "--overwrite", "--quiet"]
    subprocess.run(cmd, check=True, env={**os.environ, **(env or {})})


def make_images(work: Path, num_images: int, quality: int = DEFAULT_QUALITY) -> Path:
    """The synthetic ImageNet-like folder (made once): `num_images` JPEGs at `quality`."""
    folder = work / (f"images-{num_images}" + ("" if quality == DEFAULT_QUALITY else f"-q{quality}"))
    if not (folder / ".done").exists():
        subprocess.run([sys.executable, "-m", "tools.make_synthetic", str(folder), "--num-images",
                        str(num_images), "--num-classes", str(min(1000, num_images)), "--seed", "0",
                        "--quality", str(quality)], check=True)
        (folder / ".done").touch()
    return folder


def prepare(work: Path, num_images: int, quality: int = DEFAULT_QUALITY, x4: bool = True) -> dict[str, Any]:
    """Synthetic ImageNet-like folder, its 4x twin (same bytes, new keys; unless x4=False), and tar
    shards of both."""
    folder = make_images(work, num_images, quality)
    if not x4:
        shards = work / f"shards-{folder.name[len('images-'):]}"
        if not (shards / "manifest.json").exists():
            shardify(folder, str(shards))
        return {"folder": str(folder), "shards": str(shards)}
    big = work / f"{folder.name}-x4"
    if not (big / ".copied").exists():  # copies: the folder source reads a hard-linked file once
        for f in folder.rglob("*.jpg"):
            for copy in range(4):
                target = big / f.parent.name / f"{f.stem}_c{copy}{f.suffix}"
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.exists() and target.stat().st_nlink > 1:
                    target.unlink()
                if not target.exists():
                    shutil.copyfile(f, target)
        shutil.rmtree(work / f"shards-{big.name[len('images-'):]}", ignore_errors=True)  # from the links: again
        (big / ".copied").touch()
    shards, big_shards = work / f"shards-{folder.name[len('images-'):]}", work / f"shards-{big.name[len('images-'):]}"
    for src, dest in ((folder, shards), (big, big_shards)):
        if not (dest / "manifest.json").exists():
            shardify(src, str(dest))
    return {"folder": str(folder), "shards": str(shards), "big_shards": str(big_shards)}


def prepare_halves(work: Path, folder: str) -> list[str]:
    """The same images as two datasets (the first half of the class folders, then the rest), for
    the mixture row: a 1:1 mixture of them reads exactly the bytes of the one-dataset row."""
    classes = sorted(p for p in Path(folder).iterdir() if p.is_dir())
    urls = []
    for i, part in enumerate((classes[: len(classes) // 2], classes[len(classes) // 2:])):
        half = work / f"{Path(folder).name}-half{i}"
        if not (half / ".done").exists():
            for cls in part:
                for f in cls.glob("*.jpg"):
                    target = half / cls.name / f.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    if not target.exists():
                        os.link(f, target)
            (half / ".done").touch()
        dest = work / f"shards-{Path(folder).name}-half{i}"
        if not (dest / "manifest.json").exists():
            shardify(half, str(dest))
        urls.append(str(dest))
    return urls


def tar_urls(prefix: str) -> list[str]:
    from dataio.format.manifest import read_manifest
    from dataio.storage.store import StorageOptions, Store

    store = Store(prefix, StorageOptions.resolve(env=os.environ))
    return [f"{prefix.rstrip('/')}/{p}" for p in read_manifest(store).shard_paths]


def shard_counts(prefix: str) -> list[int]:
    from dataio.format.manifest import read_manifest
    from dataio.storage.store import StorageOptions, Store

    return list(read_manifest(Store(prefix, StorageOptions.resolve(env=os.environ))).shard_num_samples)


def page_cache_read(urls: list[str], counts: list[int]) -> tuple[Any, Any]:
    """The machine's ceiling for RAW: every shard read front to back into one reused 16 MiB buffer."""

    def batches() -> Any:
        buf = bytearray(16 * 2**20)
        for url, n in zip(urls, counts):
            with open(url, "rb", buffering=0) as f:
                total = 0
                while (got := f.readinto(buf)) > 0:
                    total += got
            yield n, total

    class Reads:
        def __iter__(self) -> Any:
            return batches()

    return Reads(), lambda b: b
