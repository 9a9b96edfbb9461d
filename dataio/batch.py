"""What a batch is, between workers and the training loop.

A batch is a dict:
    "__key__": list[str]             sample keys, N of them, delivery order
    "label":   int64 tensor [N]      (-1 where the dataset has no label)
    "image":   uint8 tensor [N,3,H,W] when images are decoded (CPU or DALI),
    FIELD:     every other field of the samples (see dataio/stream/fields.py):
               list[str]                text (txt, string columns)
               list[Any]                JSON (json, nested columns), parsed with json.loads
               int64/float64/bool [N]   numbers (cls2, numeric columns) present in every sample
               PackedBytes              other bytes (npy, ...) and, when not decoded, each image
                                        field ("jpg", "png", ...): an empty item where a sample
                                        lacks the field
    "__shard__", "__position__": int64 tensor [N]   each sample's shard number and position in
                                     it (dataio.sources_of maps them to the source file / row)
    "mask":    bool tensor [N]       True for real samples; False for padding repeats and
                                     substitutes for skipped corrupt samples (never train on them
                                     twice, never count them in evaluation)
    "read_s", "decode_s": float      seconds this batch spent being read and decoded in its worker
    "batch_number": int              rank-level batch number within the epoch
    "source":  int64 tensor [N]      a mixture's batches only: each sample's index in the
                                     sources given to make_loader (see plan/mix.py)

Raw bytes travel as one uint8 tensor plus offsets (PackedBytes), so torch moves them through
shared memory instead of pickling N byte strings across the worker pipe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class PackedBytes:
    """N byte strings packed into one uint8 tensor; item i is data[offsets[i]:offsets[i+1]]."""

    data: torch.Tensor  # uint8 [total_bytes]
    offsets: torch.Tensor  # int64 [N + 1], offsets[0] == 0

    @classmethod
    def pack(cls, items: Sequence[bytes]) -> PackedBytes:
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in items], out=offsets[1:])
        data = np.frombuffer(b"".join(items), dtype=np.uint8).copy()
        return cls(torch.from_numpy(data), torch.from_numpy(offsets))

    def __len__(self) -> int:
        return int(self.offsets.numel()) - 1

    def __getitem__(self, i: int) -> bytes:
        return self.data[int(self.offsets[i]) : int(self.offsets[i + 1])].numpy().tobytes()

    def to_list(self) -> list[bytes]:
        buf = self.data.numpy().tobytes()
        offs = self.offsets.tolist()
        return [buf[offs[i] : offs[i + 1]] for i in range(len(offs) - 1)]

    @property
    def num_bytes(self) -> int:
        return int(self.data.numel())
