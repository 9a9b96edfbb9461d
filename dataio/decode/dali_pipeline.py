"""DALI's side of dataio.decode.dali: importing DALI, building the decode pipeline, moving its output into torch.

The pipeline takes each sample's encoded bytes with the crop box and flip that DaliDecoder computed
(`fn.external_source`), decodes only the crop (`fn.decoders.image_slice`: nvJPEG on a GPU,
DALI's CPU decoder without one), resizes and lays out CHW.
"""

from __future__ import annotations

from typing import Any

import torch

from dataio.decode.cpu import DecodeConfig


def _dali() -> Any:
    """Import DALI lazily: the CPU-only install and every other module never need it."""
    try:
        import nvidia.dali as dali
        import nvidia.dali.fn  # noqa: F401 - registers dali.fn
        import nvidia.dali.types  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "decode='dali' needs NVIDIA DALI: pip install --extra-index-url "
            "https://pypi.nvidia.com nvidia-dali-cuda130 (CUDA 13) or nvidia-dali-cuda120 (CUDA 12)"
        ) from exc
    return dali


def build_pipeline(cfg: DecodeConfig, *, batch_size: int, num_threads: int, device: torch.device,
                   prefetch_queue_depth: int, seed: int) -> Any:
    """A built DALI pipeline fed by external sources "encoded", "anchor", "shape" and "mirror"."""
    dali = _dali()
    fn, types = dali.fn, dali.types
    gpu = device.type == "cuda"
    pipe = dali.pipeline.Pipeline(
        batch_size=batch_size, num_threads=num_threads,
        device_id=(device.index or 0) if gpu else None, prefetch_queue_depth=prefetch_queue_depth,
        seed=seed,
    )
    with pipe:
        encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
        anchor = fn.external_source(name="anchor", dtype=types.FLOAT, ndim=1)
        shape = fn.external_source(name="shape", dtype=types.FLOAT, ndim=1)
        mirror = fn.external_source(name="mirror", dtype=types.INT32, ndim=0)
        # Only the crop is decoded; EXIF orientation is ignored, as PIL and simplejpeg do. On the
        # GPU, nvJPEG upsamples chroma like libjpeg-turbo only when asked (fancy upsampling).
        gpu_args = {"jpeg_fancy_upsampling": True} if gpu else {}
        images = fn.decoders.image_slice(
            encoded, anchor, shape, device="mixed" if gpu else "cpu", output_type=types.RGB,
            axis_names="WH", normalized_anchor=False, normalized_shape=False, adjust_orientation=False,
            **gpu_args,
        )
        images = fn.resize(images, resize_x=cfg.size, resize_y=cfg.size, interp_type=types.INTERP_LINEAR,
                           antialias=True)
        if cfg.normalize:  # (x/255 - mean)/std == (x - 255 mean) / (255 std)
            images = fn.crop_mirror_normalize(
                images, dtype=types.FLOAT, output_layout="CHW", mirror=mirror,
                mean=[255.0 * m for m in cfg.mean], std=[255.0 * s for s in cfg.std],
            )
        else:
            images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW", mirror=mirror)
        pipe.set_outputs(images)
    pipe.build()
    return pipe


def to_torch(tensor_list: Any, device: torch.device, *, normalize: bool) -> torch.Tensor:
    """DALI's dense (n, 3, size, size) output copied into a torch tensor on `device`."""
    from nvidia.dali.plugin.pytorch import feed_ndarray

    dense = tensor_list.as_tensor()
    dtype = torch.float32 if normalize else torch.uint8
    out = torch.empty(tuple(dense.shape()), dtype=dtype, device=device)
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    feed_ndarray(dense, out, cuda_stream=stream)
    return out


def resolve_device(device: str) -> torch.device:
    """ "auto": the current CUDA device when torch sees one, else the CPU; "cpu", "cuda", "cuda:N"."""
    if device == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for but torch sees no CUDA device; use 'cpu' or 'auto'")
        return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
    return dev
