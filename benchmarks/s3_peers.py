"""The native S3 readers bench_s3 compares with: s3torchconnector's S3IterableDataset (AWS's CRT
client: parallel ranged GETs of 8 MiB parts) and a reader over obstore (Rust's object_store).

Both are installed with `pip install --target benchmarks/.s3-peers` (git-ignored; `ensure_installed`),
beside the project's venv: they need no torch of their own (s3torchconnector takes any torch >= 2.0.1),
so they run under the same torch as shardify. Each builder returns (loader, count) as loader_peers'
builders do; RAW only: batches of per-sample `bytes` and labels, like webdataset's.
"""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TARGET = HERE / ".s3-peers"
PACKAGES = ("obstore==0.12.1", "s3torchconnector==1.5.0", "s3torchconnectorclient==1.5.0")
PART_BYTES = 8 << 20  # obstore's parts: the CRT client's default part size
SHUFFLE_BUFFER = 1000  # as the webdataset row: samples shuffled within this many


def ensure_installed() -> None:
    """The peers' packages in benchmarks/.s3-peers (once), importable from this process."""
    stamp = TARGET / ".packages"
    if not (stamp.exists() and stamp.read_text() == " ".join(PACKAGES)):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(TARGET),
                        *PACKAGES], check=True)
        stamp.write_text(" ".join(PACKAGES))
    if str(TARGET) not in sys.path:
        sys.path.append(str(TARGET))


def _endpoint() -> tuple[str, str, str, str]:
    env = os.environ
    return (env["AWS_ENDPOINT_URL"], env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"],
            env.get("AWS_REGION", "us-east-1"))


def _batches(samples: Iterator[tuple[bytes, Any]], batch_size: int) -> Iterator[tuple[list[bytes], Any]]:
    """Samples shuffled within SHUFFLE_BUFFER, then batched as webdataset's row does."""
    import torch

    rng, buffer, batch = random.Random(0), [], []
    for sample in samples:
        buffer.append(sample)
        if len(buffer) < SHUFFLE_BUFFER:
            continue
        batch.append(buffer.pop(rng.randrange(len(buffer))))
        if len(batch) == batch_size:
            yield [b for b, _ in batch], torch.tensor([int(c) for _, c in batch])
            batch = []
    rng.shuffle(buffer)
    batch += buffer
    for i in range(0, len(batch), batch_size):
        part = batch[i: i + batch_size]
        yield [b for b, _ in part], torch.tensor([int(c) for _, c in part])


def _tar_samples(fileobj: Any) -> Iterator[tuple[bytes, Any]]:
    """(jpg bytes, class) of each sample of a tar stream (members KEY.jpg then KEY.cls)."""
    jpg = None
    with tarfile.open(fileobj=fileobj, mode="r|") as tar:
        for member in tar:
            data = tar.extractfile(member).read() if member.isfile() else b""  # type: ignore[union-attr]
            if member.name.endswith(".jpg"):
                jpg = data
            elif member.name.endswith(".cls") and jpg is not None:
                yield jpg, data.decode()
                jpg = None


def _count(batch: Any) -> tuple[int, int]:
    items, _ = batch
    return len(items), sum(len(b) for b in items)


def s3torchconnector_loader(urls: list[str], *, batch_size: int, num_workers: int) -> tuple[Iterable, Callable]:
    """S3IterableDataset over the tar shards (objects split between workers), as AWS's webdataset
    example reads them: each object's S3Reader streamed through tarfile, a 1000-sample shuffle."""
    ensure_installed()
    import torch
    from s3torchconnector import S3ClientConfig, S3IterableDataset

    endpoint, _, _, region = _endpoint()
    urls = list(urls)
    random.Random(0).shuffle(urls)
    objects = S3IterableDataset.from_objects(urls, region=region, endpoint=endpoint, enable_sharding=True,
                                            s3client_config=S3ClientConfig(force_path_style=True))

    class Samples(torch.utils.data.IterableDataset):
        def __iter__(self) -> Iterator[Any]:
            return _batches((s for reader in objects for s in _tar_samples(reader)), batch_size)

    return torch.utils.data.DataLoader(Samples(), batch_size=None, num_workers=num_workers,
                                       persistent_workers=num_workers > 0), _count


def obstore_loader(urls: list[str], *, batch_size: int, num_workers: int) -> tuple[Iterable, Callable]:
    """Each worker's shards (every num_workers-th) fetched whole by obstore.get_ranges in 8 MiB parts
    (in Rust, in parallel), the next shard while this one is parsed; tarfile, a 1000-sample shuffle."""
    ensure_installed()
    import torch

    urls = list(urls)
    random.Random(0).shuffle(urls)

    class Samples(torch.utils.data.IterableDataset):
        def __iter__(self) -> Iterator[Any]:
            info = torch.utils.data.get_worker_info()
            mine = urls if info is None else urls[info.id::info.num_workers]
            return _batches(_obstore_samples(mine), batch_size)

    return torch.utils.data.DataLoader(Samples(), batch_size=None, num_workers=num_workers,
                                       persistent_workers=num_workers > 0), _count


def _obstore_samples(urls: list[str]) -> Iterator[tuple[bytes, Any]]:
    import obstore
    from obstore.store import S3Store

    endpoint, key, secret, region = _endpoint()
    stores: dict[str, Any] = {}

    def fetch(url: str) -> Any:
        bucket, _, name = url.removeprefix("s3://").partition("/")
        store = stores.get(bucket)
        if store is None:
            store = stores[bucket] = S3Store(bucket, endpoint=endpoint, access_key_id=key, secret_access_key=secret,
                                             region=region, virtual_hosted_style_request=False,
                                             client_options={"allow_http": True})
        size = obstore.head(store, name)["size"]
        starts = list(range(0, size, PART_BYTES))
        parts = obstore.get_ranges(store, name, starts=starts, ends=[min(size, s + PART_BYTES) for s in starts])
        return b"".join(memoryview(p) for p in parts)

    ahead: dict[int, Any] = {}

    def start(i: int) -> None:
        if i < len(urls):
            box: dict[str, Any] = {}

            def run() -> None:
                try:
                    box["data"] = fetch(urls[i])
                except Exception as exc:  # noqa: BLE001 - raised in the consuming thread below
                    box["error"] = exc

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            ahead[i] = (thread, box)

    start(0)
    for i in range(len(urls)):
        thread, box = ahead.pop(i)
        thread.join()
        if "error" in box:
            raise box["error"]
        start(i + 1)
        yield from _tar_samples(io.BytesIO(box["data"]))
