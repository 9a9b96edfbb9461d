"""The loader's performance paths: read pieces, zero-copy parsing, one-copy packing, the window
byte cap, and the next-epoch bet of persistent workers (results must equal the plain path)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dataio import LoaderConfig, make_loader
from dataio.format.manifest import read_manifest
from dataio.stream.collate import as_bytes, pack_bytes
from dataio.loader.config import window_samples
from dataio.plan.types import Segment
from dataio.readers.base import split_segment
from dataio.readers.tar import TarPayload, TarReader, zero_copy
from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset

SIZES = [9, 0, 14, 1, 6]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("loader_io") / "ds")
    write_tar_dataset(Store(root), SIZES, real_images=True)
    return root


def test_pack_bytes_mixes_bytes_likes_and_empties() -> None:
    values = [b"ab", memoryview(b"xcdx")[1:3], bytearray(b""), b"efg"]
    packed = pack_bytes(values)
    assert packed.to_list() == [b"ab", b"cd", b"", b"efg"]
    assert packed.offsets.tolist() == [0, 2, 4, 4, 7]
    assert pack_bytes([]).to_list() == []


def test_split_segment_covers_the_segment_in_order(dataset: str) -> None:
    manifest = read_manifest(Store(dataset))
    per_sample = manifest.shard_num_bytes[2] // manifest.shard_num_samples[2]
    seg = Segment(shard=2, start=3, stop=14)
    pieces = split_segment(seg, manifest, chunk_bytes=3 * per_sample)
    assert len(pieces) > 1
    assert [p.start for p in pieces][0] == 3 and pieces[-1].stop == 14
    assert all(a.stop == b.start for a, b in zip(pieces, pieces[1:]))
    assert split_segment(seg, manifest, chunk_bytes=1 << 40) == [seg]
    assert split_segment(Segment(shard=3, start=0, stop=1), manifest, chunk_bytes=1) == [Segment(shard=3, start=0, stop=1)]


def test_zero_copy_parse_matches_the_copying_parse(dataset: str) -> None:
    store = Store(dataset)
    reader = TarReader(store, read_manifest(store))
    seg = Segment(shard=0, start=2, stop=7)
    payload = reader.fetch(seg)
    views = zero_copy(payload)
    assert isinstance(views, TarPayload) and isinstance(views.data, memoryview)
    copied, viewed = reader.parse(seg, payload), reader.parse(seg, views)
    assert [as_bytes(s) for s in viewed] == copied
    assert all(type(v) is bytes for s in (as_bytes(x) for x in viewed) for v in s.values() if not isinstance(v, (str, int)))


def test_window_is_capped_by_bytes_of_the_mean_sample(dataset: str) -> None:
    manifest = read_manifest(Store(dataset))
    mean = sum(manifest.shard_num_bytes) / sum(manifest.shard_num_samples)
    config = LoaderConfig.from_options(batch_size=2, shuffle_window=4096, shuffle_window_bytes=int(5 * mean) + 1)
    assert window_samples(manifest, config) == 5
    assert window_samples(manifest, dataclasses.replace(config, shuffle_window_bytes=None)) == 4096
    assert window_samples(manifest, dataclasses.replace(config, shuffle_window=3)) == 3
    with pytest.raises(ValueError, match="shuffle_window_bytes"):
        LoaderConfig.from_options(batch_size=2, shuffle_window_bytes=0)


def _epochs(url: str, epochs: list[int], **options) -> list[list[tuple[list[str], torch.Tensor]]]:
    out = []
    with make_loader(url, batch_size=4, decode=None, tail="pad", seed=3, rank=0, world_size=1, **options) as loader:
        for epoch in epochs:
            loader.set_epoch(epoch)
            out.append([(b["__key__"], b["jpg"].data.clone()) for b in loader])
    return out


@pytest.mark.timeout(120)
def test_next_epoch_bet_gives_the_same_batches_won_or_lost(dataset: str) -> None:
    # Workers start epoch e + 1 in the background; epochs 0, 1 (bet won), 3 (lost), 3 again (lost).
    # A fresh loader's first iteration has no bet to use: the reference for each epoch.
    with_bets = _epochs(dataset, [0, 1, 3, 3], num_workers=2, shuffle_window=5)
    fresh = [_epochs(dataset, [e], num_workers=2, shuffle_window=5)[0] for e in (0, 1, 3, 3)]
    assert [[k for k, _ in e] for e in with_bets] == [[k for k, _ in e] for e in fresh]
    for a, b in zip(with_bets, fresh):
        assert len(a) == len(b) and all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b))
