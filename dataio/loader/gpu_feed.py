"""decode="gpu" and "auto" in the loader: which decoder runs where, and the thread that feeds the GPU.

With decode="gpu" the workers stream RAW batches (the job is built with decode=None); a thread in
this process takes them in order, decodes each on the rank's device on a side CUDA stream, records
an event, and queues the batch (at most `depth` ahead, >= 2). The caller's stream waits for that
event when the batch is handed over, and the batch's device tensors are marked used on the caller's
stream (record_stream), so the caching allocator reuses their memory only once the caller is done
with them: memory stays bounded without a lifetime rule for the caller. With decode="auto" on a
CUDA device the workers decode on the CPU as decode="cpu" does, except the tickets hybrid.Split
marks raw; this thread passes decoded batches through and decodes the raw ones.

On a machine without CUDA, "auto" is decode="cpu" and "gpu" decodes on the CPU in this thread
(said once). `device_twin(codec)` makes the CPU stand in for the device (tests, gpu_check's dry
run): the same thread, queue and code path, with streams and events as no-ops.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from dataio.decode.gpu import GpuDecoder
from dataio.decode.gpu_codecs import DeviceCodec, pick_codec
from dataio.loader.config import LoaderConfig
from dataio.loader.hybrid import Split

DEPTH = 2  # decoded batches queued ahead of the caller
_TWIN: list[Callable[[], DeviceCodec]] = []  # device_twin's codec factory, while one is active
_WARNED: set[str] = set()


@contextlib.contextmanager
def device_twin(make_codec: Callable[[], DeviceCodec]) -> Iterator[None]:
    """Loaders built inside treat the CPU as a CUDA device whose decoder is `make_codec()` (a CpuTwin)."""
    _TWIN.append(make_codec)
    try:
        yield
    finally:
        _TWIN.remove(make_codec)


def device() -> torch.device | None:
    """The rank's decode device: the current CUDA device, the CPU under device_twin, else None."""
    if _TWIN:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return None


def resolved(config: LoaderConfig) -> LoaderConfig:
    """`config` with decode="auto" made "cpu" where no device decodes (no CUDA) or a hook needs the CPU."""
    if config.decode == "auto" and (device() is None or config.transform is not None or config.collate is not None):
        return dataclasses.replace(config, decode="cpu")
    return config


def job_decode(decode: str | None) -> str | None:
    """What the workers do: RAW batches for "gpu"; for "auto", CPU decode unless a ticket says raw."""
    return {"gpu": None, "auto": "cpu"}.get(decode, decode)  # type: ignore[arg-type]


def ids_of(batch: dict[str, Any], mixture: Any) -> torch.Tensor:
    """int64 [N] global sample ids of a batch from its "__shard__" / "__position__" (and "source")."""
    shard = batch["__shard__"].numpy()
    source = batch["source"].numpy() if "source" in batch else np.zeros_like(shard)
    return torch.from_numpy(mixture.shard_starts[mixture.shard_base[source] + shard] + batch["__position__"].numpy())


class GpuFeed:
    """Decodes a loader's raw batches in a background thread, `depth` ahead, onto the decode device."""

    def __init__(self, decode_config: Any, config: LoaderConfig, *, mixture: Any, url_of: Callable[[int], str],
                 image_fields: tuple[str, ...], split: Split | None = None, stats: Any = None,
                 depth: int = DEPTH) -> None:
        if depth < 2:
            raise ValueError(f"depth must be >= 2, got {depth}")
        self.device = device() or torch.device("cpu")
        codec, why = (_TWIN[-1](), "") if _TWIN else pick_codec(self.device)
        if codec is None and why not in _WARNED:
            _WARNED.add(why)
            warnings.warn(why, RuntimeWarning, stacklevel=3)
        self.decoder = GpuDecoder(decode_config, seed=config.seed, codec=codec, on_corrupt=config.on_corrupt,
                                  url_of=url_of, image_fields=image_fields, device=self.device)
        self.mixture, self.split, self.depth, self.stats = mixture, split, depth, stats
        self.cuda = self.device.type == "cuda"
        self._side = torch.cuda.Stream(self.device) if self.cuda else None
        self._stop_active: Callable[[], None] | None = None  # stops the thread of the map() in progress

    @property
    def codec_name(self) -> str:
        return self.decoder.codec.name if self.decoder.codec is not None else "none (CPU path)"

    def map(self, batches: Iterable[Any], *, epoch: int) -> Iterator[Any]:
        """The batches in order, raw ones decoded; stops the thread when closed or done, or when a newer
        map() starts. One thread per feed: the previous one is stopped before `iter(batches)` (a
        DataLoader's persistent iterator is reset there), so an iteration left open cannot race it."""
        if self._stop_active is not None:
            self._stop_active()
        out: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        batches = iter(batches)
        thread = threading.Thread(target=self._run, args=(batches, epoch, out, stop),
                                  name="dataio-gpu-feed", daemon=True)

        def stop_thread() -> None:
            stop.set()
            while thread.is_alive():  # unblock its put(), then let it finish the batch it is on
                with contextlib.suppress(queue.Empty):
                    out.get(timeout=0.05)
            if hasattr(batches, "close"):
                batches.close()
            if self._stop_active is stop_thread:
                self._stop_active = None

        self._stop_active = stop_thread
        thread.start()
        return self._drain(out, stop, stop_thread)

    def _drain(self, out: queue.Queue, stop: threading.Event, stop_thread: Callable[[], None]) -> Iterator[Any]:
        try:
            while True:
                try:
                    kind, item, event = out.get(timeout=0.1)
                except queue.Empty:
                    if stop.is_set():
                        raise RuntimeError("this GPU feed was superseded by a newer iteration; use that one") from None
                    continue
                if kind == "end":
                    return
                if kind == "error":
                    raise item
                yield self._hand_over(item, event)
        finally:
            stop_thread()

    def _run(self, batches: Iterator[Any], epoch: int, out: queue.Queue, stop: threading.Event) -> None:
        held: collections.deque = collections.deque()  # (event, raw batch): its bytes outlive the GPU's work
        try:
            for batch in batches:
                if stop.is_set():
                    return
                raw = batch.copy() if isinstance(batch, dict) else batch  # the decoder replaces its fields
                item = self._decode(batch, epoch)
                event = None
                if self.cuda:
                    event = torch.cuda.Event()
                    event.record(self._side)
                    held.append((event, raw))
                    while held and held[0][0].query():
                        held.popleft()
                out.put(("batch", item, event))
            out.put(("end", None, None))
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            out.put(("error", exc, None))

    def _decode(self, batch: Any, epoch: int) -> Any:
        """A raw batch decoded on the device; a batch a CPU worker decoded (hybrid) is moved there."""
        if not isinstance(batch, dict):
            return batch
        start = time.perf_counter()
        with torch.cuda.stream(self._side) if self.cuda else contextlib.nullcontext():
            if "image" in batch:  # decode="auto": a CPU worker decoded it
                seconds = float(batch.get("decode_s", 0.0)) + float(batch.get("read_s", 0.0))
                batch["image"] = batch["image"].to(self.device, non_blocking=True)
                self._note("cpu", len(batch["image"]), seconds)
                return batch
            batch["__id__"], batch["epoch"] = ids_of(batch, self.mixture), epoch
            decoded = self.decoder(batch)
        if self.cuda and self.split is not None:
            self._side.synchronize()  # the GPU's own time for this batch, for the split
        self._note("gpu", len(decoded["image"]), time.perf_counter() - start)
        return decoded

    def _note(self, side: str, samples: int, seconds: float) -> None:
        if self.split is not None:
            self.split.note(side, samples=samples, seconds=seconds)
        if self.stats is not None:
            counts = self.split.report() if self.split is not None else {}
            self.stats.gpu_decode = {"codec": self.codec_name, "device": str(self.device),
                                     "device_samples": self.decoder.num_device_samples,
                                     "cpu_path_samples": self.decoder.num_cpu_samples, **counts}

    def _hand_over(self, batch: Any, event: Any) -> Any:
        """The caller's stream waits for the batch's event; its device tensors are marked in use there."""
        if event is None or not isinstance(batch, dict):
            return batch
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(event)
        for value in batch.values():
            if isinstance(value, torch.Tensor) and value.is_cuda:
                value.record_stream(stream)
        return batch
