"""A RAW stream reading windows into buffers (object storage, a disk cache) starts reading its next
window only once the batch it is serving is built: the first batch's gather does not share the
cores and the GIL with the next window's reads (profiled from S3: batch 0 came ~0.1 s after its
window was read, beside the next one's reads)."""

from __future__ import annotations

import uuid

from dataio import make_loader
from dataio.storage.store import Store
from dataio.stream import raw
from dataio.stream.raw_batch import BatchBuilder
from tests.dataio.shardgen import write_tar_dataset


def test_the_next_windows_reads_start_after_the_batch_is_built(monkeypatch):
    store = Store(f"memory://read-ahead-{uuid.uuid4().hex[:8]}")
    write_tar_dataset(store, [40, 40])
    events: list[str] = []
    build, read_ahead = BatchBuilder.build, raw.RawStream._read_ahead

    def built(self, *args):
        out = build(self, *args)
        events.append("built")
        return out

    def reading_ahead(self):
        events.append("read ahead")
        return read_ahead(self)

    monkeypatch.setattr(BatchBuilder, "build", built)
    monkeypatch.setattr(raw.RawStream, "_read_ahead", reading_ahead)
    assert not store.is_local  # windows read into buffers (raw.py), not direct reads of local files
    with make_loader(store.url, batch_size=8, num_workers=0, decode=None, seed=0) as loader:
        num_batches = sum(1 for _ in loader)
    assert num_batches == 10
    assert events == ["built", "read ahead"] * num_batches  # before: each read ahead began before its build
