"""The JPEG decoders the GPU path can use, in the order it tries them, and a CPU twin of them for tests.

Each takes a batch of JPEG byte views (and each one's crop box) and returns, per sample, a CHW uint8
tensor on its device and whether it is already the crop (region-of-interest decode) or the whole
image, or None where it refuses the sample (which then goes to the CPU path inside the same batch):
- nvImageCodec (`nvidia-nvimgcodec-cu13`): the GPU's hardware JPEG engines (backend HW_GPU_ONLY)
  on A100/H100/H200-class GPUs, its default (CUDA) backends elsewhere; regions decoded directly;
- torchvision.io.decode_jpeg(list, device="cuda"): batched nvJPEG, whole images;
- none: `pick_codec` returns None and the caller decodes on the CPU (said once).
Nothing here imports a GPU library before a codec is built.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image

from dataio.decode.transforms import CropBox

Decoded = tuple[torch.Tensor, bool] | None  # (CHW uint8 on the device, is it the crop already), or refused
# Compute capabilities whose GPUs carry hardware JPEG engines nvImageCodec drives (A100: 8.0, H100/H200: 9.0).
HW_JPEG_CAPABILITIES = ((8, 0), (9, 0))


class DeviceCodec(Protocol):
    """A batch JPEG decoder on one device (see the module docstring)."""

    name: str
    device: torch.device

    def decode(self, items: Sequence[np.ndarray], boxes: Sequence[CropBox]) -> list[Decoded]: ...


class NvImgCodec:
    """nvImageCodec: hardware JPEG engines where the GPU has them, its CUDA decoder otherwise; regions
    of interest decoded directly (a region it refuses is decoded whole instead). On the CPU device
    (tests: a twin of this very path) its CPU backend."""

    def __init__(self, device: torch.device, *, hardware: bool | None = None, regions: bool = True) -> None:
        from nvidia import nvimgcodec  # ImportError: the caller tries the next decoder

        self._nv = nvimgcodec
        self.device = device
        kind = nvimgcodec.BackendKind
        if device.type == "cpu":
            index, backends, label = nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY, [nvimgcodec.Backend(kind.CPU_ONLY)], "CPU backend"
        else:
            index = device.index if device.index is not None else torch.cuda.current_device()
            hardware = has_hw_jpeg(device) if hardware is None else hardware
            backends = [nvimgcodec.Backend(kind.HW_GPU_ONLY)] if hardware else None
            label = "hardware JPEG engines, HW_GPU_ONLY" if hardware else "default backends"
        self._decoder = nvimgcodec.Decoder(device_id=index, backends=backends)
        # sRGB (the default colour spec), interleaved: grey JPEGs come out as 3 equal channels.
        self._params = nvimgcodec.DecodeParams(apply_exif_orientation=False)
        self.regions = regions
        self.name = f"nvImageCodec {getattr(nvimgcodec, '__version__', '')} ({label})".replace("  ", " ")

    def decode(self, items: Sequence[np.ndarray], boxes: Sequence[CropBox]) -> list[Decoded]:
        # Results ordered on the caller's stream (0: none, on the CPU backend).
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        out: list[Decoded] = [None] * len(items)
        todo = list(range(len(items)))
        if self.regions:
            images = self._decoder.decode([self._source(items[i], boxes[i]) for i in todo], params=self._params,
                                          cuda_stream=stream)
            for i, image in zip(todo, images):
                if image is not None:
                    out[i] = (self._tensor(image), True)
            todo = [i for i in todo if out[i] is None]
        if todo:
            images = self._decoder.decode([self._source(items[i], None) for i in todo], params=self._params,
                                          cuda_stream=stream)
            for i, image in zip(todo, images):
                if image is not None:
                    out[i] = (self._tensor(image), False)
            if self.regions and len(todo) == len(items) and any(d is not None for d in out):
                self.regions = False  # this backend decodes no regions (whole images it does): stop asking
        return out

    def _source(self, data: np.ndarray, box: CropBox | None) -> Any:
        nv = self._nv
        region = None if box is None else nv.Region(box.top, box.left, box.top + box.height, box.left + box.width)
        if hasattr(nv, "DecodeSource"):  # nvImageCodec 0.3-0.5
            return nv.DecodeSource(data, region) if region is not None else nv.DecodeSource(data)
        stream = nv.CodeStream(data)  # 0.6 on: a region is a sub-code-stream
        return stream if region is None else stream.get_sub_code_stream(region=region)

    def _tensor(self, image: Any) -> torch.Tensor:
        if self.device.type == "cpu":  # a host image: numpy reads it through __array_interface__
            return torch.from_numpy(np.array(image.cpu() if hasattr(image, "cpu") else image)).permute(2, 0, 1)
        return torch.as_tensor(image, device=self.device).permute(2, 0, 1)  # HWC on the device, no copy


class TorchvisionNvjpeg:
    """torchvision's batched nvJPEG: whole images; a batch it fails on is retried sample by sample to
    find the refused ones."""

    def __init__(self, device: torch.device) -> None:
        from torchvision.io import ImageReadMode, decode_jpeg  # ImportError: the caller tries the next

        self._decode, self._mode = decode_jpeg, ImageReadMode.RGB
        self.device = device
        self.name = "nvJPEG (torchvision.io.decode_jpeg, device='cuda')"

    def decode(self, items: Sequence[np.ndarray], boxes: Sequence[CropBox]) -> list[Decoded]:
        data = [torch.from_numpy(np.ascontiguousarray(item)) for item in items]
        try:
            return [(image, False) for image in self._decode(data, mode=self._mode, device=self.device)]
        except RuntimeError:
            pass  # one bad sample fails the whole batch: find it
        out: list[Decoded] = []
        for one in data:
            try:
                out.append((self._decode(one, mode=self._mode, device=self.device), False))
            except RuntimeError:
                out.append(None)
        return out


class CpuTwin:
    """The device decoders' stand-in on the CPU (tests, gpu_check's dry run): PIL decodes each JPEG
    whole (or its region, `regions`); `refuse(data)` True makes it refuse a sample, as a GPU decoder
    refuses what it cannot decode."""

    def __init__(self, *, regions: bool = False, refuse: Callable[[np.ndarray], bool] | None = None) -> None:
        self.device = torch.device("cpu")
        self.regions = regions
        self.refuse = refuse
        self.name = "CPU twin (PIL)" + (", regions" if regions else "")
        self.num_calls = 0  # batches it was given

    def decode(self, items: Sequence[np.ndarray], boxes: Sequence[CropBox]) -> list[Decoded]:
        self.num_calls += 1
        out: list[Decoded] = []
        for data, box in zip(items, boxes):
            if self.refuse is not None and self.refuse(data):
                out.append(None)
                continue
            try:
                with Image.open(io.BytesIO(data.tobytes())) as img:
                    rgb = np.array(img.convert("RGB"))  # writable: torch wraps it
            except Exception:  # noqa: BLE001 - a decoder refuses what it cannot read
                out.append(None)
                continue
            if self.regions:
                rgb = rgb[box.top: box.top + box.height, box.left: box.left + box.width]
            out.append((torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1), self.regions))
        return out


def has_hw_jpeg(device: torch.device) -> bool:
    """Whether `device` is a GPU with hardware JPEG engines (A100, H100, H200 class)."""
    return device.type == "cuda" and tuple(torch.cuda.get_device_capability(device)) in HW_JPEG_CAPABILITIES


def pick_codec(device: torch.device) -> tuple[DeviceCodec | None, str]:
    """(the first decoder that builds on `device`, why the others did not); None: decode on the CPU."""
    if device.type != "cuda":
        return None, f"decode='gpu' on {device}: no CUDA device, so the CPU path decodes every sample"
    why = []
    for build in (NvImgCodec, TorchvisionNvjpeg):
        try:
            return build(device), "; ".join(why)
        except Exception as exc:  # noqa: BLE001 - absent or broken: the next decoder
            why.append(f"{build.__name__}: {type(exc).__name__}: {exc}")
    return None, ("decode='gpu': neither nvImageCodec (pip install nvidia-nvimgcodec-cu13) nor torchvision's "
                  f"nvJPEG is usable ({'; '.join(why)}), so the CPU path decodes every sample")
