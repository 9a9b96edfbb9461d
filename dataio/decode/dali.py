"""Decode and augment raw image batches with NVIDIA DALI: nvJPEG on a GPU, DALI's CPU operators without one.

DALI is imported (by dali_pipeline, the only module that does) only when a DaliDecoder is built. The crop box and
flip of every sample are computed here, in Python, with the CPU path's arithmetic and per-sample
seeds (dataio.rand), and fed to DALI through `fn.external_source`: DALI then decodes only
that region (`fn.decoders.image_slice`, the ROI decode `image_random_crop` uses internally),
resizes and lays out CHW. So a sample's augmentation depends on (seed, epoch, sample id) only,
as on the CPU path, whatever the batching, the resume point or the device.
A sample DALI should not see (unreadable header, pixel limit, GIF, CMYK) and every batch DALI
fails on go through dataio.decode.cpu.CpuDecoder and the loader's corrupt-sample policy.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from dataio.decode.cpu import DecodeConfig
from dataio.decode.dali_pipeline import build_pipeline, resolve_device, to_torch
from dataio.decode.device_batch import MainProcessDecoder, RowFixer, image_items, plan_row, sample_seeds
from dataio.decode.images import IMAGE_FIELD_ORDER
from dataio.decode.transforms import CropBox

ON_CORRUPT = ("raise", "skip")
_DALI_FORMATS = ("jpeg", "png", "webp", "bmp")  # formats DALI decodes like PIL; the rest go to the CPU
# Colour modes DALI turns into the CPU path's pixels. Alpha (RGBA, LA, palettes that may carry
# transparency) is composited on black by the CPU path, which DALI does not do; 16-bit modes
# ("I;16", "RGB;16", ...), CMYK/YCCK and GIF/TIFF go to the CPU path as well, per sample.
_DALI_MODES = ("RGB", "L")


@dataclasses.dataclass(slots=True)
class _Job:
    """One batch on its way through DALI: the input batch and what was fed for it."""

    batch: dict[str, Any]
    fields: tuple[str, ...]  # the batch's raw image fields, dropped from the output
    items: list[np.ndarray]  # uint8 views into the batch's PackedBytes: no copy per sample
    seeds: list[int]
    dali_rows: list[int]  # rows decoded by DALI, in feed order
    cpu_rows: list[int]  # rows the CPU decoder handles (DALI would refuse or differ)
    feeds: dict[str, Any]  # external_source name -> the batch fed to it
    is_pad: bool = False  # a copy fed only to fill DALI's first prefetch round; output dropped
    dali_s: float = 0.0


class DaliDecoder(MainProcessDecoder):
    """Decode raw batches (image bytes as PackedBytes) into uint8 N,3,H,W (or normalized float) tensors.

    `dec(batch)` decodes one batch synchronously; `dec.map(batches)` keeps up to
    `prefetch_queue_depth` batches in DALI at once. Raw batches may carry "__id__" (int64 [N],
    global sample ids) and "epoch" so the augmentation equals the CPU path's; otherwise the
    sample key and `set_epoch` seed it.
    """

    def __init__(
        self, decode_config: DecodeConfig, *, batch_size: int, seed: int, num_threads: int = 2,
        prefetch_queue_depth: int = 2, device: str = "auto", on_corrupt: str = "raise",
        url_of: Callable[[int], str] | None = None, image_fields: tuple[str, ...] = IMAGE_FIELD_ORDER,
    ) -> None:
        if not isinstance(decode_config, DecodeConfig):
            raise TypeError(f"decode_config must be a dataio.decode.cpu.DecodeConfig, got {type(decode_config).__name__}")
        for name, value, minimum in (("batch_size", batch_size, 1), ("seed", seed, 0),
                                     ("num_threads", num_threads, 1), ("prefetch_queue_depth", prefetch_queue_depth, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
        if on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt must be one of {ON_CORRUPT}, got {on_corrupt!r}")
        self.config = decode_config
        self.batch_size, self.seed = batch_size, seed
        self.num_threads, self.prefetch_queue_depth = num_threads, prefetch_queue_depth
        self.device = resolve_device(device)
        self.on_corrupt = on_corrupt
        self.url_of = url_of
        self.image_fields = tuple(image_fields)  # each row's image: the first of these it has bytes in
        self.epoch = 0
        self.num_rebuilds = 0  # pipelines rebuilt after DALI failed on a batch
        self._rows = RowFixer(decode_config, on_corrupt=on_corrupt, url_of=url_of)
        self._pipe: Any = None
        self._started = False  # DALI's first run queues `prefetch_queue_depth` iterations at once
        self._in_flight: deque[_Job] = deque()
        self._generation = 0  # bumped by every map(): an abandoned iterator cannot disturb a newer one

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch with "image" in place of its raw image field and "decode_s" increased."""
        (out,) = self.map([batch])
        return out

    def map(self, batches: Iterable[dict[str, Any]], *, epoch: int | None = None) -> Iterator[dict[str, Any]]:
        """Decode batches in order, up to `prefetch_queue_depth` of them inside DALI at a time (each
        batch carries its epoch: `epoch` is the GPU feed's argument, unused here).

        A new map() (or call) supersedes one left unfinished: its queued batches are dropped and
        the old iterator raises RuntimeError if resumed.
        """
        self._generation += 1
        generation = self._generation
        self._reset()
        try:
            for batch in batches:
                self._check(generation)
                self._submit(self._prepare(batch))
                while self._started and len(self._in_flight) >= self.prefetch_queue_depth:
                    done = self._collect()
                    if done is not None:
                        yield done
                        self._check(generation)
            self._check(generation)
            if not self._started and self._in_flight:
                self._start_padded()
            while self._in_flight:
                done = self._collect()
                if done is not None:
                    yield done
                    self._check(generation)
        finally:
            if generation == self._generation:
                self._reset()  # abandoned or failed mid-way: drop what is still queued in DALI

    def _check(self, generation: int) -> None:
        if generation != self._generation:
            raise RuntimeError("this DaliDecoder.map() iterator was superseded by a newer map() or call")

    def _reset(self) -> None:
        if self._in_flight:  # outputs still queued inside DALI belong to nobody now: rebuild
            self._in_flight.clear()
            self._pipe, self._started = None, False

    # --- preparation: header checks, crop boxes, flips ---------------------------------------
    def _prepare(self, batch: dict[str, Any]) -> _Job:
        fields, items = image_items(batch, self.image_fields)
        keys = [str(k) for k in batch["__key__"]]
        if len(keys) != len(items) or not 0 < len(items) <= self.batch_size:
            raise ValueError(f"batch has {len(keys)} keys and {len(items)} images; expected 1..{self.batch_size} of each")
        seeds = sample_seeds(batch, keys, seed=self.seed, epoch=self.epoch)
        dali_rows, cpu_rows, boxes, flips = [], [], [], []
        for i, data in enumerate(items):
            plan = self._plan(data, seeds[i])
            if plan is None:
                cpu_rows.append(i)
                continue
            dali_rows.append(i)
            boxes.append((plan[0].left, plan[0].top, plan[0].width, plan[0].height))
            flips.append(plan[1])
        feeds: dict[str, Any] = {}
        if dali_rows:
            # Dense (n, ...) arrays: external_source reads the outer dimension as the batch.
            box = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)  # (n, [x, y, w, h]) in pixels
            feeds = {"encoded": [items[i] for i in dali_rows], "anchor": np.ascontiguousarray(box[:, :2]),
                     "shape": np.ascontiguousarray(box[:, 2:]), "mirror": np.asarray(flips, dtype=np.int32)}
        return _Job(batch, fields, items, seeds, dali_rows, cpu_rows, feeds)

    def _plan(self, data: np.ndarray, seed: int) -> tuple[CropBox, bool] | None:
        """(crop box, flip) from the header, or None when the CPU path should decode this sample."""
        return plan_row(self.config, data, seed, formats=_DALI_FORMATS, modes=_DALI_MODES)

    # --- DALI: in-flight queue, failure recovery ----------------------------------------------
    def _submit(self, job: _Job) -> None:
        self._in_flight.append(job)
        if not job.dali_rows:
            return  # nothing for DALI: resolved on the CPU when collected
        try:
            self._feed(job)
            if self._started:
                self._pipe.schedule_run()
            elif sum(1 for j in self._in_flight if j.dali_rows) == self.prefetch_queue_depth:
                self._pipe.schedule_run()  # the first run starts `prefetch_queue_depth` iterations
                self._started = True
        except RuntimeError:
            self._recover(failed=None)

    def _start_padded(self) -> None:
        """Fewer batches than the prefetch depth before the first run: feed dropped copies to fill it."""
        fed = [j for j in self._in_flight if j.dali_rows]
        if not fed:
            return
        pads = [dataclasses.replace(fed[-1], is_pad=True) for _ in range(self.prefetch_queue_depth - len(fed))]
        try:
            for pad in pads:
                self._in_flight.append(pad)
                self._feed(pad)
            self._pipe.schedule_run()
            self._started = True
        except RuntimeError:
            self._recover(failed=None)

    def _collect(self) -> dict[str, Any] | None:
        """Finish the oldest in-flight job; None for a padding copy."""
        job = self._in_flight.popleft()
        images = None
        if job.dali_rows:
            try:
                start = time.perf_counter()
                (out,) = self._pipe.outputs()
                images = self._to_torch(out)
                job.dali_s += time.perf_counter() - start
            except RuntimeError:
                self._recover(failed=job)
        return None if job.is_pad else self._finish(job, images)

    def _feed(self, job: _Job) -> None:
        if self._pipe is None:
            self._pipe = self._build()
        start = time.perf_counter()
        for name, data in job.feeds.items():
            self._pipe.feed_input(name, data)
        job.dali_s += time.perf_counter() - start

    def _recover(self, *, failed: _Job | None) -> None:
        """DALI fails a whole batch on one bad image and its pipeline is then unusable: rebuild it.

        The failed job (if known) goes to the CPU path; the other in-flight jobs are fed again.
        """
        self.num_rebuilds += 1
        self._pipe, self._started = None, False
        pending = [j for j in self._in_flight if not j.is_pad]
        self._in_flight.clear()
        if failed is None and pending:
            failed = next((j for j in pending if j.dali_rows), None)  # fed first, the likeliest culprit
        if failed is not None:
            failed.cpu_rows, failed.dali_rows = list(range(len(failed.items))), []
        for job in pending:
            self._submit(job)
        if not self._started and self._in_flight:
            self._start_padded()

    def _build(self) -> Any:
        return build_pipeline(self.config, batch_size=self.batch_size, num_threads=self.num_threads,
                              device=self.device, prefetch_queue_depth=self.prefetch_queue_depth, seed=self.seed)

    def _to_torch(self, tensor_list: Any) -> torch.Tensor:
        return to_torch(tensor_list, self.device, normalize=self.config.normalize)

    # --- assembly: CPU rows, corrupt policy, the output batch ---------------------------------
    def _finish(self, job: _Job, dali_images: torch.Tensor | None) -> dict[str, Any]:
        start = time.perf_counter()
        size, n = self.config.size, len(job.items)
        dtype = torch.float32 if self.config.normalize else torch.uint8
        images = torch.empty((n, 3, size, size), dtype=dtype, device=self.device)
        if dali_images is not None:
            images[job.dali_rows] = dali_images
        done, bad = self._rows.decode_rows(job.batch, job.fields, job.items, job.seeds, job.cpu_rows)
        for i, image in done.items():
            images[i] = image
        return self._rows.output(job.batch, job.fields, images, bad, job.dali_s + time.perf_counter() - start)
