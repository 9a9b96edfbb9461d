"""An in-memory loader with the ShardLoader contract and a known cost per batch.

It serves tensors (random ones for `synthetic:` URLs, or any images/labels given) in the same
batch dicts as `dataio.make_loader`, is Stateful at any world size, and can sleep a fixed
time per batch, so tests know the truth the overlap report must find. It is also the
trainer's "fake data" mode for measuring the step without storage:
    synthetic:?samples=1024&classes=10&delay_s=0.05&prefetch=2&slow_rank=1&slow_delay_s=0.1
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import torch

from dataio.errors import StateError
from dataio.loader.protocol import DatasetFacts, SourceFacts

STATE_VERSION = 1
_PARAMS = {"samples": int, "classes": int, "delay_s": float, "prefetch": int, "slow_rank": int,
           "slow_delay_s": float, "decode_s": float}


class MemoryLoader:
    """Batches of `labels` [S] int64 and `images` [P,3,H,W] uint8 (sample i shows image i mod P).

    The epoch order is a seeded permutation; each step takes the next world_size * batch_size
    positions and this rank the rank-th slice, so the state is (epoch, position) and loads at any
    world size. tail="drop" drops the last partial global batch, "pad" repeats samples, mask False.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, *, batch_size: int, rank: int,
                 world_size: int, seed: int, tail: str = "drop", delay_s: float = 0.0,
                 decode_s: float = 0.0, prefetch: int = 0, fingerprint: str = "memory") -> None:
        if tail not in ("drop", "pad"):
            raise ValueError(f"tail must be 'drop' or 'pad', got {tail!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        num = int(labels.shape[0])
        if tail == "drop" and num < batch_size * world_size:
            raise ValueError(
                f"{fingerprint}: {num} samples cannot fill one global batch of {world_size} ranks x "
                f"{batch_size}; use a smaller --batch-size (at most {num // world_size})"
            )
        self.images, self.labels = images, labels
        self.batch_size, self.rank, self.world_size, self.seed = batch_size, rank, world_size, seed
        self.tail, self.delay_s, self.decode_s, self.prefetch = tail, delay_s, decode_s, prefetch
        self.fingerprint = fingerprint
        # What a trainer reads of a loader (dataio.loader.protocol.TrainLoader).
        self.label_names: tuple[str, ...] | None = None
        self.num_classes: int | None = None  # synthetic_loader sets its class count
        self.stats = None
        self.epoch, self.position = 0, 0
        self._slow_rank, self._slow_s = -1, 0.0

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    @property
    def facts(self) -> DatasetFacts:
        """Its identity (the fingerprint given), size and bytes per uint8 image served from memory."""
        image_bytes = float(self.images[0].numel() * self.images.element_size()) if len(self.images) else 0.0
        return DatasetFacts(identity=self.fingerprint, num_samples=self.num_samples, bytes_per_sample=image_bytes,
                            mixed=False, sources=(SourceFacts(url=self.fingerprint, share=1.0,
                                                              field_names=("image", "label"), has_labels=True),))

    def shares_at(self, samples_seen: int) -> list[float] | None:  # noqa: ARG002 - one source, no schedule
        return None

    def where(self, batch: dict[str, Any], i: int) -> str:
        return ""  # in memory: no shard to name

    def sources_added_since(self, state_dict: dict[str, Any]) -> int:  # noqa: ARG002 - one source, always
        return 0

    def close(self) -> None:
        pass

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch`; a state loaded for this same epoch keeps its position."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def __len__(self) -> int:
        left, global_batch = self.num_samples - self.position, self.batch_size * self.world_size
        return -(-left // global_batch) if self.tail == "pad" else left // global_batch

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "kind": "memory", "fingerprint": self.fingerprint,
                "seed": self.seed, "batch_size": self.batch_size, "epoch": self.epoch,
                "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state` (saved at any world size); StateError says what does not match."""
        for key in ("version", "kind", "fingerprint", "seed"):
            if state.get(key) != self.state_dict()[key]:
                raise StateError(
                    f"loader state {key}={state.get(key)!r} does not match this loader's "
                    f"{self.state_dict()[key]!r}; resume with the same dataset and --seed, or --resume none"
                )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def _order(self) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.num_samples, generator=gen)

    def _make(self, order: torch.Tensor, start: int, number: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        delay = self.delay_s + (self._slow_s if self.rank == self._slow_rank else 0.0)
        if delay:
            time.sleep(delay)
        t1 = time.perf_counter()
        pos = torch.arange(start, start + self.batch_size)
        mask = pos < self.num_samples
        idx = order[torch.where(mask, pos, pos % self.num_samples)]
        if self.decode_s:
            time.sleep(self.decode_s)
        batch = {"__key__": [f"{int(i):06d}" for i in idx], "label": self.labels[idx].clone(),
                 "image": self.images[idx % self.images.shape[0]], "mask": mask, "read_s": t1 - t0,
                 "decode_s": time.perf_counter() - t1, "batch_number": number}
        return batch

    def slow_down(self, rank: int, extra_s: float) -> None:
        """Make `rank` take `extra_s` longer per batch (a straggler on purpose)."""
        self._slow_rank, self._slow_s = rank, extra_s

    def _batches(self) -> Iterator[tuple[int, dict[str, Any]]]:
        order, global_batch = self._order(), self.batch_size * self.world_size
        first, steps = self.position, len(self)
        for k in range(steps):
            start = first + k * global_batch + self.rank * self.batch_size
            yield first + (k + 1) * global_batch, self._make(order, start, k)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        source = self._batches() if self.prefetch == 0 else _ahead(self._batches(), self.prefetch)
        for end, batch in source:
            # The state counts what was handed to the training loop, not what was prefetched.
            self.position = min(end, self.num_samples)
            yield batch


def _ahead(items: Iterator[Any], depth: int) -> Iterator[Any]:
    """Run `items` in a thread up to `depth` ahead (loading overlapped with the consumer)."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop, done = threading.Event(), object()

    def run() -> None:
        for item in items:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
        q.put(done)

    thread = threading.Thread(target=run, daemon=True, name="synthetic-prefetch")
    thread.start()
    try:
        while (item := q.get()) is not done:
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


def parse_synthetic(url: str) -> dict[str, Any]:
    """The parameters of a synthetic: URL; unknown ones raise ValueError."""
    parts = urlsplit(url)
    params: dict[str, Any] = {"samples": 1024, "classes": 10, "delay_s": 0.0, "prefetch": 0,
                              "slow_rank": -1, "slow_delay_s": 0.0, "decode_s": 0.0}
    for key, value in parse_qsl(parts.query):
        if key not in _PARAMS:
            raise ValueError(f"{url!r}: unknown parameter {key!r}; known: {sorted(_PARAMS)}")
        try:
            params[key] = _PARAMS[key](value)
        except ValueError:
            raise ValueError(f"{url!r}: {key}={value!r} is not a {_PARAMS[key].__name__}") from None
    if params["samples"] < 1 or params["classes"] < 1:
        raise ValueError(f"{url!r}: samples and classes must be >= 1")
    return params


def synthetic_loader(url: str, *, batch_size: int, rank: int, world_size: int, seed: int,
                     image_size: int, tail: str = "drop", train: bool = True) -> MemoryLoader:
    """A MemoryLoader of random images for a synthetic: URL (labels = index mod classes)."""
    p = parse_synthetic(url)
    gen = torch.Generator().manual_seed(1234 if train else 4321)
    pool = torch.randint(0, 256, (16, 3, image_size, image_size), dtype=torch.uint8, generator=gen)
    index = torch.arange(p["samples"])
    loader = MemoryLoader(pool, index % p["classes"], batch_size=batch_size, rank=rank,
                          world_size=world_size, seed=seed, tail=tail, delay_s=p["delay_s"],
                          decode_s=p["decode_s"], prefetch=p["prefetch"], fingerprint=url)
    if p["slow_rank"] >= 0:
        loader.slow_down(p["slow_rank"], p["slow_delay_s"])
    loader.num_classes = p["classes"]
    return loader
