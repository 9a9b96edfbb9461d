"""Several sources' readers behind one, for a mixture (plan/mix.py): global segments in, samples out.

A mixture numbers shards and samples globally, the sources' concatenated: source s's shard j is
shard_base[s] + j and its sample i is id_base[s] + i. MixedReader splits a global Segment into
pieces of the source that owns it, fetches and parses them with that source's own reader (tar
or Parquet, local or s3://), and gives each sample its global __id__ (its source follows from it).
The sources' label fields may be named differently (tar `cls`, Hugging Face `label`): each is
renamed to the first source's, so batch["label"] comes from every source (image fields need no
renaming: a sample's image is whichever image field it has).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dataio.format.manifest import Manifest
from dataio.plan.types import Segment
from dataio.readers.base import Sample, SegmentReader, split_segment


@dataclass(frozen=True, slots=True)
class SourcePiece:
    """A piece of one source's shard, in that source's own shard numbers."""

    source: int
    seg: Segment


class MixedReader:
    """fetch / parse / payload_bytes over the sources' readers; split_segment maps global segments."""

    def __init__(self, readers: Sequence[SegmentReader], manifests: Sequence[Manifest], *,
                 label_fields: Sequence[str] = ()) -> None:
        self.readers, self.manifests = list(readers), list(manifests)
        self.shard_base = [0]
        self.id_base = [0]
        for m in manifests:
            self.shard_base.append(self.shard_base[-1] + len(m.shard_num_samples))
            self.id_base.append(self.id_base[-1] + sum(m.shard_num_samples))
        # Per source, (its label field, the first source's) when they differ: renamed on parse.
        first = label_fields[0] if label_fields else None
        self.renames = [(f, first) if first is not None and f != first else None
                        for f in label_fields] or [None] * len(self.readers)

    def split_segment(self, seg: Segment) -> list[SourcePiece]:
        """The pieces (as readers.base.split_segment) of a global segment, tagged with their source."""
        s = bisect.bisect_right(self.shard_base, seg.shard) - 1
        local = Segment(shard=seg.shard - self.shard_base[s], start=seg.start, stop=seg.stop)
        return [SourcePiece(s, piece) for piece in split_segment(local, self.manifests[s])]

    def payload_bytes(self, piece: SourcePiece) -> int:
        return self.readers[piece.source].payload_bytes(piece.seg)

    def fetch(self, piece: SourcePiece) -> Any:
        return self.readers[piece.source].fetch(piece.seg)

    def parse(self, piece: SourcePiece, payload: Any) -> list[Sample]:
        """The piece's samples with global __id__ (and the first source's label field). A sample's
        source follows from its id (Mixture.sources_of), so nothing else is added per sample."""
        samples = self.readers[piece.source].parse(piece.seg, payload)
        base, rename = self.id_base[piece.source], self.renames[piece.source]
        if base:
            for sample in samples:
                sample["__id__"] += base
        if rename is not None:
            old, new = rename
            for sample in samples:
                if old in sample:
                    sample[new] = sample.pop(old)
        return samples
