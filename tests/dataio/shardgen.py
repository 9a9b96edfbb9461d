"""Small deterministic tar and Parquet datasets for tests, written without the shardify writer.

`write_tar_dataset(store, [5, 0, 3])` publishes shards/shard-000000.tar (+ .idx, + .sums) ... and
a manifest (version 3; checksums=False: one as written before per-sample checksums); it returns
the manifest and the samples per shard as readers should yield them (with `__url__`, the
redacted URL of their shard).
Keys are the global sample id, zero-padded, so they are unique across shards.
"""

from __future__ import annotations

import io
import json
import random
import tarfile
from collections.abc import Sequence

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.memory import MemoryFileSystem

from dataio.format.checksums import dumps_sums, file_row_group_sums, sample_sums, sums_path
from dataio.format.manifest import Field, Manifest, checksum_bytes, write_manifest
from dataio.format.tar_index import build_index
from dataio.plan.types import Segment
from dataio.storage.store import RetryPolicy, Store

# Retries without sleeping, for tests that inject faults.
FAST_RETRY = RetryPolicy(max_attempts=3, base_delay_s=0.0, max_delay_s=0.0)


def Seg(shard: int, start: int, stop: int) -> Segment:  # noqa: N802 - reads as the type it builds
    """The plan's own Segment, built positionally for short test tables."""
    return Segment(shard=shard, start=start, stop=stop)


TAR_FIELDS = (Field(name="jpg", type="image"), Field(name="cls", type="int"), Field(name="json", type="json"))


def tiny_jpeg(i: int, size: tuple[int, int] = (24, 16)) -> bytes:
    """A real small JPEG whose colour depends on i."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, ((i * 37) % 256, (i * 91) % 256, (i * 13) % 256)).save(buf, format="JPEG")
    return buf.getvalue()


def make_samples(
    shard_sizes: Sequence[int], *, seed: int = 0, num_classes: int = 10, real_images: bool = False
) -> list[list[dict]]:
    """Samples per shard: {"__key__", "__id__", "jpg" bytes, "cls" int, "json" bytes}; deterministic."""
    rng = random.Random(seed)
    shards, next_id = [], 0
    for n in shard_sizes:
        samples = []
        for _ in range(n):
            i = next_id
            next_id += 1
            jpg = tiny_jpeg(i) if real_images else rng.randbytes(rng.randint(1, 3000))
            samples.append({
                "__key__": f"{i:06d}", "__id__": i, "jpg": jpg, "cls": i % num_classes,
                "json": json.dumps({"i": i}).encode(),
            })
        shards.append(samples)
    return shards


def tar_bytes(samples: Sequence[dict], fields: Sequence[str] = ("jpg", "cls", "json")) -> bytes:
    """A WebDataset tar (plain ustar headers) of the samples' `fields` in that order (a field a sample
    lacks is left out); cls written as ASCII."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for s in samples:
            for ext in (e for e in fields if e in s):
                value = s[ext]
                data = str(value).encode() if isinstance(value, int) else value
                info = tarfile.TarInfo(f"{s['__key__']}.{ext}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def as_tar_sample(sample: dict, url: str) -> dict:
    """What a tar reader yields for a generated sample of the shard at `url` (cls as ASCII bytes)."""
    return {**sample, "__url__": url, "cls": str(sample["cls"]).encode()}


def write_tar_dataset(
    store: Store, shard_sizes: Sequence[int], *, seed: int = 0, real_images: bool = False, checksums: bool = True,
) -> tuple[Manifest, list[list[dict]]]:
    """Publish tar shards, their v1.2 indexes and the manifest; return it and the tar-shaped samples."""
    shards = make_samples(shard_sizes, seed=seed, real_images=real_images)
    manifest = write_tar_samples(store, shards, checksums=checksums)
    return manifest, [[as_tar_sample(s, store.url_of(rel)) for s in samples]
                      for samples, rel in zip(shards, manifest.shard_paths)]


def write_tar_samples(store: Store, shards: Sequence[Sequence[dict]], *, checksums: bool = True,
                      fields: Sequence[str] = ("jpg", "cls", "json")) -> Manifest:
    """Publish the given samples (one list per shard) as tar shards (members in `fields` order) +
    v1.2 indexes (+ per-sample checksum sidecars) + manifest."""
    paths, sizes, sums, idx_paths, idx_sizes, idx_sums, sample_sum_files = [], [], [], [], [], [], []
    for i, samples in enumerate(shards):
        data = tar_bytes(samples, fields)
        tar_index = build_index(io.BytesIO(data))
        index = tar_index.dumps()
        rel = f"shards/shard-{i:06d}.tar"
        store.write_bytes(rel, data)
        store.write_bytes(rel + ".idx", index)
        sidecar = dumps_sums(sample_sums(data, tar_index.samples))
        store.write_bytes(sums_path(rel), sidecar)
        sample_sum_files.append(checksum_bytes(sidecar))
        for column, value in ((paths, rel), (sizes, len(data)), (sums, checksum_bytes(data)),
                              (idx_paths, rel + ".idx"), (idx_sizes, len(index)), (idx_sums, checksum_bytes(index))):
            column.append(value)
    manifest = Manifest(
        format="tar", fields=TAR_FIELDS, shard_paths=tuple(paths),
        shard_num_samples=tuple(len(s) for s in shards), shard_num_bytes=tuple(sizes),
        shard_checksums=tuple(sums), index_paths=tuple(idx_paths), index_num_bytes=tuple(idx_sizes),
        index_checksums=tuple(idx_sums), source="tests.shardgen",
        sums_checksums=tuple(sample_sum_files) if checksums else (),
    )
    write_manifest(store, manifest)
    return manifest


def parquet_bytes(samples: Sequence[dict], *, row_group_size: int) -> tuple[bytes, tuple[int, ...]]:
    """A Parquet file (columns __key__ string, jpg binary, cls int64, json string) and its row-group sizes."""
    table = pa.table({
        "__key__": pa.array([s["__key__"] for s in samples], pa.string()),
        "jpg": pa.array([s["jpg"] for s in samples], pa.binary()),
        "cls": pa.array([s["cls"] for s in samples], pa.int64()),
        "json": pa.array([s["json"].decode() for s in samples], pa.string()),
    })
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=row_group_size)
    data = buf.getvalue()
    md = pq.ParquetFile(io.BytesIO(data)).metadata
    return data, tuple(md.row_group(g).num_rows for g in range(md.num_row_groups))


def as_parquet_sample(sample: dict, url: str) -> dict:
    """What a Parquet reader yields for a generated sample of the shard at `url` (json as str, cls as int)."""
    return {**sample, "__url__": url, "json": sample["json"].decode()}


def write_parquet_dataset(
    store: Store, shard_sizes: Sequence[int], *, row_group_size: int = 4, seed: int = 0, real_images: bool = False,
    checksums: bool = True,
) -> tuple[Manifest, list[list[dict]]]:
    """Publish Parquet shards and the manifest; return it and the Parquet-shaped samples."""
    shards = make_samples(shard_sizes, seed=seed, real_images=real_images)
    paths, sizes, sums, groups, group_sums = [], [], [], [], []
    for i, samples in enumerate(shards):
        data, row_groups = parquet_bytes(samples, row_group_size=row_group_size)
        rel = f"shards/shard-{i:06d}.parquet"
        store.write_bytes(rel, data)
        group_sums.append(file_row_group_sums(io.BytesIO(data)) if row_groups else ())
        for column, value in ((paths, rel), (sizes, len(data)), (sums, checksum_bytes(data)), (groups, row_groups)):
            column.append(value)
    manifest = Manifest(
        format="parquet",
        fields=(Field(name="jpg", type="image"), Field(name="cls", type="int"), Field(name="json", type="str")),
        shard_paths=tuple(paths), shard_num_samples=tuple(shard_sizes), shard_num_bytes=tuple(sizes),
        shard_checksums=tuple(sums), row_groups=tuple(groups), source="tests.shardgen",
        row_group_checksums=tuple(group_sums) if checksums else (),
    )
    write_manifest(store, manifest)
    return manifest, [[as_parquet_sample(s, store.url_of(rel)) for s in samples]
                      for samples, rel in zip(shards, manifest.shard_paths)]


class FlakyMemoryFS(MemoryFileSystem):
    """memory:// under the protocol flaky://, whose shard reads fail as `faults` says, in order.

    A fault is an exception instance (raised) or "short" (the read returns one byte too few);
    only reads of shard files (not indexes or the manifest) consume faults.
    """

    protocol = "flaky"
    store: dict = {}  # its own namespace, apart from memory://
    pseudo_dirs = [""]
    faults: list = []
    shard_reads = 0

    def cat_file(self, path, start=None, end=None, **kwargs):  # noqa: ANN001, ANN201 - fsspec's signature
        data = super().cat_file(path, start, end, **kwargs)
        if "/shards/" in path and not path.endswith((".idx", ".sums")):
            type(self).shard_reads += 1
            if type(self).faults:
                fault = type(self).faults.pop(0)
                if fault == "short":
                    return data[:-1]
                raise fault
        return data


fsspec.register_implementation("flaky", FlakyMemoryFS, clobber=True)
