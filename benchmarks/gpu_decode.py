"""gpu_check's decode step: the loader's RAW batches decoded on the GPU, against our CPU decode per core.

nvJPEG through `torchvision.io.decode_jpeg(device="cuda")` on whole batches, then each sample's
RandomResizedCrop window (drawn as the CPU path draws it) cropped and resized on the GPU; with
DALI importable also DALI's mixed decoders (region `image_slice` vs full `image` + GPU slice, at
`hw_decoder_load` default and 0). The dry run uses CPU twins of the same steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from dataio.decode.cpu import CpuDecoder, DecodeConfig
from dataio.decode.transforms import CropBox
from dataio.rand import sample_seed

SIZE = 224


def raw_batches(url: str, *, batch_size: int, num_batches: int) -> list[dict[str, Any]]:
    """`num_batches` RAW batches (decode=None: PackedBytes of JPEGs) from the loader, copied out."""
    from dataio import make_loader

    out: list[dict[str, Any]] = []
    with make_loader(url, batch_size=batch_size, num_workers=2, seed=0, rank=0, world_size=1, decode=None,
                     tail="pad") as loader:
        while len(out) < num_batches:
            for batch in loader:
                first = sum(len(o["jpg"]) for o in out)  # ids seed each sample's crop: stream positions
                out.append({"jpg": batch["jpg"].to_list(), "ids": list(range(first, first + len(batch["jpg"])))})
                if len(out) >= num_batches:
                    break
    return out


def _boxes(dec: CpuDecoder, batch: dict[str, Any], shapes: list[tuple[int, int]]) -> list[tuple[CropBox, bool]]:
    return [dec._plan(h, w, sample_seed(0, 0, i)) for (h, w), i in zip(shapes, batch["ids"], strict=True)]


def _crop_resize(images: list[torch.Tensor], plans: list[tuple[CropBox, bool]]) -> torch.Tensor:
    """CHW uint8 images -> (N, 3, SIZE, SIZE) uint8: each one's window, antialiased bilinear, flipped."""
    out = []
    for img, (box, flip) in zip(images, plans, strict=True):
        crop = img[:, box.top:box.top + box.height, box.left:box.left + box.width].unsqueeze(0).float()
        small = F.interpolate(crop, size=(SIZE, SIZE), mode="bilinear", antialias=True, align_corners=False)
        out.append(small.flip(-1) if flip else small)
    return torch.cat(out).round_().clamp_(0, 255).to(torch.uint8)


def nvjpeg_decoder(device: torch.device) -> tuple[str, Callable[[list[bytes]], list[torch.Tensor]]]:
    """(name, fn: JPEG bytes -> CHW uint8 tensors on `device`): torchvision's batched nvJPEG on a GPU;
    its CPU twin (torchvision's CPU decode, or simplejpeg where torchvision is missing) otherwise."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError:
        decode_jpeg = None
    if device.type == "cuda":
        if decode_jpeg is None:
            raise RuntimeError("torchvision is not importable: the nvJPEG step needs torchvision.io.decode_jpeg")
        def gpu(blobs: list[bytes]) -> list[torch.Tensor]:
            data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        return "nvJPEG, torchvision.io.decode_jpeg(device='cuda')", gpu
    if decode_jpeg is not None:
        return "CPU twin: torchvision.io.decode_jpeg", lambda blobs: [
            decode_jpeg(torch.frombuffer(bytearray(b), dtype=torch.uint8), mode=ImageReadMode.RGB) for b in blobs]
    import simplejpeg

    return "CPU twin: simplejpeg (no torchvision here)", lambda blobs: [
        torch.from_numpy(simplejpeg.decode_jpeg(b)).permute(2, 0, 1) for b in blobs]


def _timed(batches: list[dict[str, Any]], step: Callable[[dict[str, Any]], Any], sync: Callable[[], None]) -> float:
    step(batches[0])  # warm-up: CUDA context, nvJPEG handles, allocator
    sync()
    start, n = time.perf_counter(), 0
    for batch in batches[1:]:
        step(batch)
        n += len(batch["jpg"])
    sync()
    return n / (time.perf_counter() - start)


def measure_nvjpeg(batches: list[dict[str, Any]], device: torch.device) -> dict[str, Any]:
    """images/s of decode alone and of decode + crop + resize + flip (the training tensor), on `device`."""
    name, decode = nvjpeg_decoder(device)
    dec = CpuDecoder(DecodeConfig(size=SIZE))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def full(batch: dict[str, Any]) -> torch.Tensor:
        images = decode(batch["jpg"])
        return _crop_resize(images, _boxes(dec, batch, [tuple(i.shape[1:]) for i in images]))

    return {"decoder": name, "decode_per_s": _timed(batches, lambda b: decode(b["jpg"]), sync),
            "decode_crop_per_s": _timed(batches, full, sync)}


def measure_gpu_decoder(batches: list[dict[str, Any]], device: torch.device) -> dict[str, Any]:
    """The loader's own GPU decoder (dataio.decode.gpu, decode="gpu"): images/s of decode + RRC crop +
    resize 224 + flip with the first device decoder that builds (nvImageCodec, else nvJPEG); its CPU
    twin on the dry run."""
    from dataio.batch import PackedBytes
    from dataio.decode.gpu import GpuDecoder
    from dataio.decode.gpu_codecs import CpuTwin, pick_codec

    codec, why = pick_codec(device) if device.type == "cuda" else (CpuTwin(), "")
    if codec is None:
        return {"error": why}
    dec = GpuDecoder(DecodeConfig(size=SIZE), seed=0, codec=codec)
    raw = [{"__key__": [str(i) for i in b["ids"]], "jpg": PackedBytes.pack(b["jpg"]),
            "__id__": torch.tensor(b["ids"]), "epoch": 0} for b in batches]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rate = _timed(raw, lambda b: dec(dict(b)), sync)
    return {"codec": codec.name, "per_s": rate, "cpu_path_samples": dec.num_cpu_samples,
            "device_samples": dec.num_device_samples}


def measure_cpu_per_core(batches: list[dict[str, Any]], num_images: int = 128) -> float:
    """Our CpuDecoder (region decode where built) on one core: images per CPU-second, as in DECODE."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        blobs = [b for batch in batches for b in batch["jpg"]][:num_images]
        dec = CpuDecoder(DecodeConfig(size=SIZE))
        dec.decode_batch(blobs[:8], seeds=list(range(8)))
        start = time.process_time()
        dec.decode_batch(blobs, seeds=[sample_seed(0, 0, i) for i in range(len(blobs))])
        return len(blobs) / max(time.process_time() - start, 1e-9)
    finally:
        torch.set_num_threads(threads)


def dali_rows(batches: list[dict[str, Any]], device: torch.device) -> dict[str, float]:
    """DALI mixed decode (or its CPU twin): region vs full + slice, hw_decoder_load default and 0."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return {}
    rows = {}
    loads = (None, 0.0) if device.type == "cuda" else (None,)
    for region_decode in (True, False):
        for load in loads:
            name = f"DALI {'region image_slice' if region_decode else 'full image + slice'}" + (
                "" if load is None else f", hw_decoder_load={load:g}")
            rows[name] = _dali_rate(batches, device, region_decode=region_decode, hw_load=load)
    return rows


def _dali_rate(batches: list[dict[str, Any]], device: torch.device, *, region_decode: bool,
               hw_load: float | None) -> float:
    pipe, feed = _dali_pipeline(device, batch_size=len(batches[0]["jpg"]), region_decode=region_decode,
                                hw_load=hw_load)
    dec = CpuDecoder(DecodeConfig(size=SIZE))
    from dataio.decode.images import jpeg_header

    def step(batch: dict[str, Any]) -> Any:
        shapes = [jpeg_header(b)[:2] for b in batch["jpg"]]
        feed(batch["jpg"], _boxes(dec, batch, shapes))
        return pipe.run()

    return _timed(batches, step, torch.cuda.synchronize if device.type == "cuda" else (lambda: None))


def _dali_pipeline(device: torch.device, *, batch_size: int, region_decode: bool, hw_load: float | None) -> Any:
    import nvidia.dali as dali
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    gpu = device.type == "cuda"
    pipe = dali.pipeline.Pipeline(batch_size=batch_size, num_threads=4, device_id=0 if gpu else None,
                                  prefetch_queue_depth=1, exec_async=False, exec_pipelined=False)
    extra = ({"hw_decoder_load": hw_load} if hw_load is not None else {}) if gpu else {}
    with pipe:
        encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
        anchor = fn.external_source(name="anchor", dtype=types.FLOAT, ndim=1)
        shape = fn.external_source(name="shape", dtype=types.FLOAT, ndim=1)
        pixels = {"axis_names": "WH", "normalized_anchor": False, "normalized_shape": False}
        where = {"device": "mixed" if gpu else "cpu", "output_type": types.RGB, **extra}
        if region_decode:
            images = fn.decoders.image_slice(encoded, anchor, shape, **pixels, **where)
        else:
            images = fn.slice(fn.decoders.image(encoded, **where), anchor, shape, **pixels)
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE, antialias=True)
        pipe.set_outputs(fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW"))
    pipe.build()

    def feed(blobs: list[bytes], plans: list[tuple[CropBox, bool]]) -> None:
        pipe.feed_input("encoded", [np.frombuffer(b, dtype=np.uint8) for b in blobs])
        pipe.feed_input("anchor", [np.array([p.left, p.top], dtype=np.float32) for p, _ in plans])
        pipe.feed_input("shape", [np.array([p.width, p.height], dtype=np.float32) for p, _ in plans])
    return pipe, feed

