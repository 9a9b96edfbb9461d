"""One batched crop + antialiased resize + flip for a whole batch of decoded images, on their device.

An antialiased bilinear resize is separable: for each sample, out = Wy @ image @ Wx^T, where Wy
(size x H) and Wx (size x W) hold the triangle filter widened by the downscale factor (PIL's and
torch's `antialias=True` weights, the CPU path's resize), zero outside the crop box and normalized
over the pixels inside it (the box's edges clamp, as a crop does). The crop box and the flip live
in those matrices, so the whole batch is two batched matmuls on a zero-padded (N, 3, H, W) stack:
no Python loop per image, and the CPU path's boxes give the CPU path's pixels within a grey level
or two (the decoders' own differences aside).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

PAD_MULTIPLE = 64  # padded heights and widths are rounded up: few distinct sizes for the allocator to keep


def resize_weights(starts: torch.Tensor, lengths: torch.Tensor, *, size: int, extent: int,
                   flips: torch.Tensor | None = None) -> torch.Tensor:
    """(N, size, extent) float32: row i of sample n spreads output pixel i over input pixels
    [starts[n], starts[n] + lengths[n]) with the antialiased bilinear filter; reversed where flips."""
    device = starts.device
    starts, lengths = starts.to(torch.float32), lengths.to(torch.float32)
    scale = (lengths / size)[:, None, None]  # (N, 1, 1) input pixels per output pixel
    support = scale.clamp(min=1.0)  # the triangle widens when downscaling (antialias)
    out_i = torch.arange(size, device=device, dtype=torch.float32)[None, :, None]  # (1, size, 1)
    if flips is not None:  # a horizontal flip reads output pixel i from mirror position size-1-i
        out_i = torch.where(flips.to(device)[:, None, None], (size - 1) - out_i, out_i)
    centre = (out_i + 0.5) * scale  # (N, size, 1) in crop coordinates
    pixel = torch.arange(extent, device=device, dtype=torch.float32)[None, None, :] - starts[:, None, None]
    weights = (1.0 - ((pixel + 0.5 - centre) / support).abs()).clamp(min=0.0)  # (N, size, extent)
    inside = (pixel >= 0) & (pixel < lengths[:, None, None])
    weights = weights * inside
    # Every output pixel has at least its nearest input pixel: the sum is never 0.
    return weights / weights.sum(dim=2, keepdim=True).clamp(min=1e-12)


def padded_stack(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """CHW uint8 images of any sizes -> (N, 3, H, W) uint8 zero-padded (H, W rounded up to PAD_MULTIPLE)."""
    height = max(int(im.shape[1]) for im in images)
    width = max(int(im.shape[2]) for im in images)
    shape = (len(images), 3, -(-height // PAD_MULTIPLE) * PAD_MULTIPLE, -(-width // PAD_MULTIPLE) * PAD_MULTIPLE)
    with warnings.catch_warnings():  # torch calls its strided nested tensors a prototype
        warnings.simplefilter("ignore", UserWarning)
        nested = torch.nested.nested_tensor(list(images), dtype=torch.uint8, device=images[0].device)
    return nested.to_padded_tensor(0, output_size=shape)


def crop_resize(images: Sequence[torch.Tensor], boxes: torch.Tensor, flips: torch.Tensor, *, size: int,
                out: torch.Tensor | None = None, mean_std: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """CHW uint8 images (one device) -> (N, 3, size, size): each one's box (int64 (N, 4): top, left,
    height, width in its own pixels), resized antialiased, flipped where `flips` (bool (N,)).

    uint8 (rounded) unless `mean_std` ((3,) mean, (3,) std on 0..1 pixels) asks for normalized
    float32; `out`, when given, is filled and returned (a reused buffer).
    """
    if not len(images):
        raise ValueError("crop_resize needs at least one image")
    device = images[0].device
    stack = padded_stack(images)  # (N, 3, H, W) uint8
    boxes = boxes.to(device=device, dtype=torch.int64)
    wy = resize_weights(boxes[:, 0], boxes[:, 2], size=size, extent=stack.shape[2])  # (N, size, H)
    wx = resize_weights(boxes[:, 1], boxes[:, 3], size=size, extent=stack.shape[3], flips=flips)  # (N, size, W)
    pixels = stack.to(torch.float32)
    rows = torch.matmul(pixels, wx.transpose(1, 2).unsqueeze(1))  # (N, 3, H, size)
    result = torch.matmul(wy.unsqueeze(1), rows)  # (N, 3, size, size)
    if mean_std is not None:
        mean, std = (t.to(device=device, dtype=torch.float32).view(1, 3, 1, 1) for t in mean_std)
        result = (result.round_().clamp_(0, 255) / 255.0 - mean) / std
        return result if out is None else out.copy_(result)
    result = result.round_().clamp_(0, 255)
    if out is None:
        return result.to(torch.uint8)
    return out.copy_(result)
