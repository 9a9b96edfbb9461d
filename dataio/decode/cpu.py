"""CPU image decode and augmentation: bytes -> (3, size, size) uint8 (or normalized float32).

Train mode is RandomResizedCrop + horizontal flip, eval mode is resize-shorter-side + centre crop.
The crop is chosen in original pixel coordinates from the header alone, so the pixel limit is
checked before any pixel is decoded and JPEGs are decoded with DCT scaling (1/2, 1/4, 1/8) when
the crop still spans at least `size` pixels at that scale; where the region decode extension is
built (dataio/decode/region.py), only the crop's iMCU-aligned region is decoded. Randomness comes from a per-sample seed
(see dataio.rand.sample_seed), so any worker reproduces a sample's augmentation.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from dataio.decode.images import (
    DEFAULT_MAX_PIXELS,
    JPEG_MAGIC,
    check_pixels,
    jpeg_header,
    pil_pixel_limit,
)
from dataio.decode import region
from dataio.decode.transforms import CropBox, center_crop, jpeg_scale_denom, random_resized_crop
from dataio.errors import CorruptSampleError, ImageTooLargeError
from dataio.rand import SampleRandom

try:
    import simplejpeg
except ImportError:  # optional: PIL decodes everything when it is missing
    simplejpeg = None

DECODERS = ("auto", "region", "simplejpeg", "pil")
_SIMPLEJPEG_COLORSPACES = ("YCbCr", "Gray", "RGB")  # CMYK / YCCK go through PIL, which inverts Adobe CMYK


@dataclass(frozen=True, kw_only=True, slots=True)
class DecodeConfig:
    """How images become training (or evaluation) tensors."""

    size: int = 224  # output is size x size
    train: bool = True  # True: random resized crop (+ flip); False: resize shorter side, centre crop
    scale: tuple[float, float] = (0.08, 1.0)  # RandomResizedCrop's range of crop area / image area
    ratio: tuple[float, float] = (3 / 4, 4 / 3)  # RandomResizedCrop's range of crop width / height
    flip: bool = True  # train only: flip horizontally with probability 1/2
    crop_fraction: float = 0.875  # eval only: centre crop side / shorter side (224/256, ImageNet's)
    max_pixels: int = DEFAULT_MAX_PIXELS
    normalize: bool = False  # False: uint8 CHW; True: float32 CHW, (x/255 - mean)/std
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    # "auto": JPEG crops by region decode where the extension is built, else simplejpeg, else PIL;
    # "region" (refused when not built) | "simplejpeg" (whole-image decode) | "pil"
    decoder: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1:
            raise ValueError(f"size must be a positive int, got {self.size!r}")
        if len(self.scale) != 2 or not 0 < self.scale[0] <= self.scale[1]:
            raise ValueError(f"scale must be (low, high) with 0 < low <= high, got {self.scale!r}")
        if len(self.ratio) != 2 or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"ratio must be (low, high) with 0 < low <= high, got {self.ratio!r}")
        if not 0 < self.crop_fraction <= 1:
            raise ValueError(f"crop_fraction must be in (0, 1], got {self.crop_fraction!r}")
        if self.max_pixels < 1:
            raise ValueError(f"max_pixels must be positive, got {self.max_pixels!r}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(f"mean and std need 3 values each, std > 0; got {self.mean!r}, {self.std!r}")
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {self.decoder!r}")
        if self.decoder == "simplejpeg" and simplejpeg is None:
            raise ValueError("decoder='simplejpeg' but simplejpeg is not installed: pip install simplejpeg, "
                             "or use decoder='pil'")
        if self.decoder == "region" and not region.available():
            raise ValueError(f"decoder='region' but the region decode extension is not available "
                             f"({region.why_unavailable()}): {region.HOW_TO_BUILD}; or use decoder='auto'")


class CpuDecoder:
    """Decode and augment images on the CPU; picklable, stateless, safe to share between threads.

    `transform`, when given, is called once per sample with a contiguous (3, size, size) uint8
    torch.Tensor (after crop and flip, before normalization) and must return a uint8 tensor or
    numpy array of that same shape; it may modify its argument in place and return it. It gets no
    seed: randomness it draws from a global generator is not reproduced on resume.

    `num_threads` > 1 makes decode_batch share a batch between that many threads (the caller's
    included, started per call): simplejpeg's decode and torch's resize release the GIL, so one
    batch comes sooner on several cores, bit for bit the same (each sample has its own seed).
    """

    def __init__(
        self, config: DecodeConfig, *, transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        num_threads: int = 1,
    ) -> None:
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be an int >= 1, got {num_threads!r}")
        self.config = config
        self.transform = transform
        self.num_threads = num_threads
        self._use_simplejpeg = simplejpeg is not None and config.decoder != "pil"
        self._use_region = region.available() and config.decoder in ("auto", "region")
        self._use_planes = self._use_region and region.has_planes()
        if config.decoder == "auto":
            region.warn_unavailable_once()
        std = np.asarray(config.std, dtype=np.float32).reshape(3, 1, 1)
        self._norm_scale = 1.0 / (255.0 * std)  # x/255/std == x * scale
        self._norm_shift = np.asarray(config.mean, dtype=np.float32).reshape(3, 1, 1) / std

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32 if self.config.normalize else np.uint8)

    def decode(self, data: bytes, *, seed: int, key: str = "", url: str = "") -> np.ndarray:
        """One image (bytes-like) -> (3, size, size) uint8, float32 if normalize; errors name url and key."""
        out = np.empty((3, self.config.size, self.config.size), dtype=self.dtype)
        self._decode_into(data, seed, key, url, out)
        return out

    def decode_batch(
        self, items: Sequence[bytes], *, seeds: Sequence[int], keys: Sequence[str] | None = None,
        url: str | Sequence[str] = "", out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """N images -> one (N, 3, size, size) tensor, filled in place; the first bad sample raises.

        `url` is the shard of every item, or one URL per item when a batch spans shards; `out`, when
        given, is that tensor (e.g. in shared memory, where the batch travels from), returned filled.
        """
        urls = [url] * len(items) if isinstance(url, str) else url
        lengths = {len(items), len(seeds), len(urls), len(keys) if keys is not None else len(items)}
        if len(lengths) != 1:
            raise ValueError(f"items, seeds, keys and urls must have the same length: {len(items)}, {len(seeds)}, "
                             f"{len(keys) if keys is not None else None}, {len(urls)}")
        size = self.config.size
        shape = (len(items), 3, size, size)
        if out is not None and (tuple(out.shape) != shape or out.numpy().dtype != self.dtype):
            raise ValueError(f"out must be a {shape} tensor of {self.dtype}, got {tuple(out.shape)} {out.dtype}")
        pixels = out.numpy() if out is not None else np.empty(shape, dtype=self.dtype)
        todo = iter(range(len(items)))  # shared by the threads: next() on a range iterator is atomic
        errors: dict[int, BaseException] = {}

        def work() -> None:
            for i in todo:
                if errors:  # every lower index was taken before this one: the first error is known
                    return
                try:
                    self._decode_into(items[i], seeds[i], keys[i] if keys is not None else "", urls[i], pixels[i])
                except BaseException as exc:  # noqa: BLE001 - the lowest index is raised below
                    errors[i] = exc

        helpers = [threading.Thread(target=work, name="dataio-decode", daemon=True)
                   for _ in range(min(self.num_threads, len(items)) - 1)]
        for thread in helpers:
            thread.start()
        work()
        for thread in helpers:
            thread.join()
        if errors:
            raise errors[min(errors)]  # the first bad sample, whichever thread met it
        return out if out is not None else torch.from_numpy(pixels)

    def _decode_into(self, data: bytes, seed: int, key: str, url: str, out: np.ndarray) -> None:
        found = None
        if (self._use_region or self._use_simplejpeg) and bytes(memoryview(data)[:2]) == JPEG_MAGIC:
            found = self._via_libjpeg(data, seed, key, url)  # any bytes-like input
        # None: not a JPEG, a JPEG libjpeg cannot or will not decode, or decoder="pil".
        crop, flip = found if found is not None else self._via_pil(data, seed, key, url)
        if self._use_planes:  # the same pixels, ~60 us less per image: no strided copies in torch or numpy
            plain = self.transform is None and not self.config.normalize
            chw = out if plain else np.empty((3, self.config.size, self.config.size), dtype=np.uint8)
            region.to_planes(_resize_hwc(crop, self.config.size), chw, flip=flip)
            if not plain:
                self._finish(chw, out, key)
            return
        chw = _resize(crop, self.config.size)
        self._finish(chw[:, :, ::-1] if flip else chw, out, key)

    def _plan(self, height: int, width: int, seed: int) -> tuple[CropBox, bool]:
        """The crop box in original pixels and whether to flip; the same whichever decoder runs."""
        cfg = self.config
        if not cfg.train:
            return center_crop(height, width, fraction=cfg.crop_fraction), False
        rng = SampleRandom(seed)
        box = random_resized_crop(height, width, rng, scale=cfg.scale, ratio=cfg.ratio)
        return box, cfg.flip and rng.uniform() < 0.5

    def _via_libjpeg(self, data: bytes, seed: int, key: str, url: str) -> tuple[np.ndarray, bool] | None:
        """(HWC crop, flip), or None to let PIL try (unusual colour space, recoverable damage).

        Region decode first (only the crop's iMCU-aligned region), else simplejpeg's whole image."""
        header = jpeg_header(data)
        if header is None:
            return None
        height, width, colorspace = header
        check_pixels(width, height, max_pixels=self.config.max_pixels, url=url, key=key)
        if colorspace not in _SIMPLEJPEG_COLORSPACES:
            return None
        box, flip = self._plan(height, width, seed)
        denom = jpeg_scale_denom(height, width, box, self.config.size)
        if self._use_region:
            scaled_hw = (-(-height // denom), -(-width // denom))  # libjpeg rounds the scaled size up
            window = _scaled_box(box, height, width, *scaled_hw)
            crop = region.decode_window(data, denom=denom, window=window, scaled_hw=scaled_hw)
            if crop is not None or not self._use_simplejpeg:
                return None if crop is None else (crop, flip)
        try:
            # min sizes equal to the 1/denom size make simplejpeg pick exactly that power-of-2 scale.
            pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=-(-height // denom),
                                            min_width=-(-width // denom))
        except ValueError:  # strict mode: also recoverable warnings; PIL accepts those, refuses truncation
            return None
        x0, y0, x1, y1 = _scaled_box(box, height, width, pixels.shape[0], pixels.shape[1])
        return np.ascontiguousarray(pixels[y0:y1, x0:x1]), flip

    def _via_pil(self, data: bytes, seed: int, key: str, url: str) -> tuple[np.ndarray, bool]:
        try:
            with pil_pixel_limit(self.config.max_pixels):  # a raised limit is ours to enforce, not PIL's
                img = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError:
            raise _too_large(url, key, "more pixels than PIL's own limit") from None
        except Exception as exc:  # noqa: BLE001 - PIL raises many types for bad data
            raise _corrupt(url, key, "not a readable image", exc) from None
        with img:
            width, height = img.size
            check_pixels(width, height, max_pixels=self.config.max_pixels, url=url, key=key)
            box, flip = self._plan(height, width, seed)
            try:
                if img.format == "JPEG":
                    denom = jpeg_scale_denom(height, width, box, self.config.size)
                    if denom > 1:  # draft picks the largest 1/d with size >= the request
                        img.draft("RGB", (width // denom, height // denom))
                rgb = _to_rgb(img)
            except Exception as exc:  # noqa: BLE001
                raise _corrupt(url, key, "image does not decode", exc) from None
        crop = rgb.crop(_scaled_box(box, height, width, rgb.height, rgb.width))
        return np.array(crop), flip  # writable: torch refuses to wrap read-only arrays

    def _finish(self, chw: np.ndarray, out: np.ndarray, key: str) -> None:
        """(3, size, size) uint8 -> the slot `out`, through the user transform and normalization."""
        if self.transform is not None:
            chw = self._apply_transform(np.ascontiguousarray(chw), key)
        if self.config.normalize:
            np.multiply(chw, self._norm_scale, out=out, casting="unsafe")
            out -= self._norm_shift
        else:
            out[...] = chw

    def _apply_transform(self, chw: np.ndarray, key: str) -> np.ndarray:
        result = self.transform(torch.from_numpy(chw))
        arr = result.numpy() if isinstance(result, torch.Tensor) else result
        size = self.config.size
        if not isinstance(arr, np.ndarray) or arr.shape != (3, size, size) or arr.dtype != np.uint8:
            got = f"{type(result).__name__} {getattr(result, 'shape', '')} {getattr(result, 'dtype', '')}"
            raise ValueError(f"sample {key!r}: transform must return a uint8 (3, {size}, {size}) tensor, got {got}")
        return arr


def _scaled_box(box: CropBox, height: int, width: int, scaled_h: int, scaled_w: int) -> tuple[int, int, int, int]:
    """The crop box (left, top, right, bottom) in whole pixels of the image decoded at scaled_h x scaled_w."""
    sy, sx = scaled_h / height, scaled_w / width
    x0, y0 = min(round(box.left * sx), scaled_w - 1), min(round(box.top * sy), scaled_h - 1)
    x1, y1 = round((box.left + box.width) * sx), round((box.top + box.height) * sy)
    return x0, y0, max(x0 + 1, min(x1, scaled_w)), max(y0 + 1, min(y1, scaled_h))


def _resize(hwc: np.ndarray, size: int) -> np.ndarray:
    """(H, W, 3) uint8 -> (3, size, size) uint8, antialiased bilinear.

    torch's uint8 path matches PIL's BILINEAR within one grey level and is ~3x faster than the
    Pillow wheel (AVX2); the (1, 3, H, W) view of an HWC array is channels-last, its fast layout.
    """
    image = torch.from_numpy(hwc).permute(2, 0, 1).unsqueeze(0)
    out = F.interpolate(image, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return out[0].numpy()


def _resize_hwc(hwc: np.ndarray, size: int) -> np.ndarray:
    """(H, W, 3) uint8 -> (size, size, 3) uint8: _resize's pixels, left interleaved.

    F.interpolate returns (3, size, size) planes, converting from its channels-last result through a
    strided copy (~45 us of its ~120); the `out=` form writes the channels-last result straight into
    an interleaved array.
    """
    result = torch.empty((size, size, 3), dtype=torch.uint8)
    image = torch.from_numpy(hwc).permute(2, 0, 1).unsqueeze(0)
    torch.ops.aten._upsample_bilinear2d_aa.out(image, [size, size], False, None, None,
                                               out=result.permute(2, 0, 1).unsqueeze(0))
    return result.numpy()


def _to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode -> RGB uint8, decoding the pixels.

    16-bit samples keep their top 8 bits (not a clip), and so do 32-bit integer ones (mode I: the
    top 8 of the file's bits per sample, 16 where the file says 16); floating-point samples (mode F)
    in [0, 1] are scaled by 255, others clipped to 0-255 (NaN is 0); alpha (RGBA, LA, palette
    transparency) is composited on BLACK: RGB * alpha / 255, so a transparent pixel is black
    whatever colour it stores; CMYK/YCCK JPEGs go through PIL's conversion (Adobe's inverted CMYK
    included).
    """
    if img.mode == "RGB":
        img.load()
        return img
    if img.mode.startswith("I;16") or img.mode in ("I", "F"):
        arr = np.asarray(img)
        if img.mode.startswith("I;16"):
            arr = arr.astype(np.uint32) >> 8
        elif img.mode == "I":
            arr = np.clip(arr.astype(np.int64), 0, None) >> (_bits_per_sample(img) - 8)
        else:
            arr = np.nan_to_num(arr.astype(np.float64), nan=0.0, posinf=255.0, neginf=0.0)
            if arr.size and arr.max() <= 1.0:  # the [0, 1] convention of float images
                arr = arr * 255.0
            arr = np.clip(np.rint(arr), 0, 255)
        return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "L").convert("RGB")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (img.mode == "P" and "transparency" in img.info) \
            or (img.mode in ("L", "RGB", "1") and "transparency" in img.info):
        rgba = np.asarray(img.convert("RGBA"))  # (H, W, 4) uint8; premultiplied modes converted by PIL
        alpha = rgba[:, :, 3:4].astype(np.uint16)
        rgb = (rgba[:, :, :3].astype(np.uint16) * alpha + 127) // 255  # over black, rounded
        return Image.fromarray(rgb.astype(np.uint8), "RGB")
    return img.convert("RGB")


def _bits_per_sample(img: Image.Image) -> int:
    """A mode-I image's bits per sample as its file states them (TIFF tag 258), else 32."""
    tags = getattr(img, "tag_v2", None)
    bits = tags.get(258) if tags is not None else None
    if isinstance(bits, tuple):
        bits = bits[0] if bits else None
    return int(bits) if isinstance(bits, int) and 8 <= bits <= 32 else 32


def _corrupt(url: str, key: str, what: str, exc: BaseException) -> CorruptSampleError:
    return CorruptSampleError(
        f"{url}: sample {key!r}: {what} ({type(exc).__name__}: {exc}); replace or drop this sample "
        "(shardify write --on-error skip leaves such files out), or pass on_corrupt='skip' to the loader "
        "to substitute it", url=url, key=key)


def _too_large(url: str, key: str, what: str) -> ImageTooLargeError:
    return ImageTooLargeError(
        f"{url}: sample {key!r}: image declares {what}; refusing to decode (decompression bomb?)",
        url=url, key=key)
