"""One batched crop + antialiased resize + flip for a whole batch of decoded images, on their device.

Each sample's crop box is copied into a padded (N, 3, H, W) stack (one slice copy per image: the only
per-image step, built on the host). An antialiased bilinear resize is separable: out = Wy @ crop @ Wx^T,
where Wy (size x H) and Wx (size x W) hold the triangle filter widened by the downscale factor (PIL's
and torch's `antialias=True` weights, the CPU path's resize), zero beyond the crop and normalized over
its pixels (its edges clamp, as a crop does); a flip reverses Wx's rows. So the whole batch is two
batched matmuls, and the CPU path's boxes give the CPU path's pixels within a grey level (the
decoders' own differences aside)."""

from __future__ import annotations

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


def padded_crops(images: Sequence[torch.Tensor], boxes: torch.Tensor) -> torch.Tensor:
    """Each CHW uint8 image's box (top, left, height, width) -> (N, 3, H, W) uint8, crop n at [n, :, :h, :w].

    H and W are the largest box's, rounded up to PAD_MULTIPLE; what lies beyond a crop is left as it
    is (the resize weights are zero there). One slice copy per image: the requests, built on the host.
    """
    rows = boxes.tolist()
    height = -(-max(r[2] for r in rows) // PAD_MULTIPLE) * PAD_MULTIPLE
    width = -(-max(r[3] for r in rows) // PAD_MULTIPLE) * PAD_MULTIPLE
    stack = torch.empty((len(images), 3, height, width), dtype=torch.uint8, device=images[0].device)
    for n, (image, (top, left, h, w)) in enumerate(zip(images, rows)):
        stack[n, :, :h, :w] = image[:, top: top + h, left: left + w]
    return stack


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
    stack = padded_crops(images, boxes)  # (N, 3, H, W) uint8: crop n at the top left of plane n
    lengths = boxes.to(device=device, dtype=torch.int64)[:, 2:]  # (N, [height, width])
    zeros = torch.zeros(len(images), dtype=torch.int64, device=device)
    wy = resize_weights(zeros, lengths[:, 0], size=size, extent=stack.shape[2])  # (N, size, H)
    wx = resize_weights(zeros, lengths[:, 1], size=size, extent=stack.shape[3], flips=flips)  # (N, size, W)
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
