"""RAW batches read straight into the batch from local shards (stream/raw_direct.py).

Local tar shards take no window buffer: each batch's samples are read into its own tensors. It
delivers what the general path (a dict per sample) and the window path (a disk cache in front:
windows read into reused buffers) deliver, same samples, same order, every field; a changed
byte anywhere in a sample's checksummed span (its data, a header between its members) fails
naming the shard and the key; shard files are closed when the iteration ends.
"""

from __future__ import annotations

import os

import pytest

from dataio import make_loader
from dataio.errors import ShardFormatError
from dataio.format.manifest import read_manifest
from dataio.stream.raw_io import RawIo
from dataio.readers.by_format import make_reader
from dataio.storage.store import Store
from tests.dataio.loader_helpers import SIZES, TOTAL, batch_summary
from tests.dataio.shardgen import make_samples, write_tar_samples

pytestmark = pytest.mark.timeout(300)
RAW = dict(decode=None, seed=3, tail="pad", rank=0, world_size=1)


def summaries(url: str, epochs: int = 2, **options) -> list[list[tuple]]:
    out = []
    with make_loader(url, **{**RAW, **options}) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            out.append([batch_summary(b) for b in loader])
    return out


@pytest.fixture(scope="module")
def mixed_fields(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Members in the order cls, npy, jpg, json: two packed fields around the label; every third
    sample lacks npy, every fifth lacks json."""
    shards = make_samples(SIZES, real_images=True)
    for samples in shards:
        for s in samples:
            i = s["__id__"]
            if i % 3:
                s["npy"] = bytes(range(i % 250)) * 7
            if i % 5 == 0:
                del s["json"]
    url = str(tmp_path_factory.mktemp("direct") / "ds")
    write_tar_samples(Store(url), shards, fields=("cls", "npy", "jpg", "json"))
    return url


@pytest.fixture
def window_takes(monkeypatch):
    """Every window buffer RawIo hands out, by size."""
    taken: list[int] = []
    take = RawIo.take

    def recording(self, num_bytes, *, ahead):
        taken.append(num_bytes)
        return take(self, num_bytes, ahead=ahead)

    monkeypatch.setattr(RawIo, "take", recording)
    return taken


@pytest.mark.parametrize("options", [
    dict(batch_size=4, shuffle_window=6),  # batches straddle windows
    dict(batch_size=5, shuffle_window=4096, tail="drop", verify_checksums=False),  # spans from the index
    dict(batch_size=3, shuffle_window=2, fields=("jpg", "cls")),  # projected: npy and json still hashed
])
def test_direct_reads_deliver_what_the_general_and_window_paths_deliver(mixed_fields, tmp_path, options,
                                                                        window_takes):
    direct = summaries(mixed_fields, num_workers=0, **options)
    assert not window_takes  # local shards: no window buffer at all
    threads = summaries(mixed_fields, num_workers=2, **options)
    assert not window_takes
    general = summaries(mixed_fields, num_workers=0, transform=lambda sample: sample, **options)
    windows = summaries(mixed_fields, num_workers=0, cache_dir=str(tmp_path / "cache"), cache_limit_bytes=1 << 30,
                        **options)
    cached = dict(cache_dir=str(tmp_path / "cache2"), cache_limit_bytes=1 << 30)
    threads_windows = summaries(mixed_fields, num_workers=2, **cached, **options)
    assert window_takes  # a disk cache in front: the window path
    assert direct == general == windows
    assert threads == threads_windows
    names = {name for b in direct[0] for name, _ in b[2]}
    assert {"jpg", "label"} <= names and ("npy" in names) == ("fields" not in options)
    assert sum(m for b in direct[0] for m in b[1]) == TOTAL - (TOTAL % 5 if options.get("tail") == "drop" else 0)


def test_reused_slabs_and_worker_processes_get_the_same_bytes(mixed_fields):
    options = dict(batch_size=4, shuffle_window=6)
    direct = summaries(mixed_fields, num_workers=0, **options)
    assert summaries(mixed_fields, num_workers=0, reuse_buffers=True, **options) == direct
    threads = summaries(mixed_fields, num_workers=2, **options)
    assert summaries(mixed_fields, num_workers=2, worker_mode="processes", multiprocessing_context="fork",
                     **options) == threads
    assert summaries(mixed_fields, num_workers=2, worker_mode="processes", multiprocessing_context="fork",
                     reuse_buffers=True, **options) == threads


def _flip(url: str, shard: int, sample: int, where: str) -> str:
    """Flip one byte of a sample: in its jpg data, or in the tar header just before its jpg."""
    store = Store(url)
    manifest = read_manifest(store)
    reader = make_reader(store, manifest)
    entry = reader.index(shard).samples[sample]
    jpg = next(m for m in entry.members if m.ext == "jpg")
    offset = jpg.offset + jpg.size // 2 if where == "data" else jpg.offset - 512 + 100  # the header's mode field
    path = store.path(manifest.shard_paths[shard])
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ 0x5A]))
    return entry.key


@pytest.mark.parametrize("where", ["data", "header"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_changed_byte_in_the_span_fails_naming_shard_and_key(tmp_path, where, num_workers):
    url = str(tmp_path / "ds")
    shards = make_samples([6, 9])
    write_tar_samples(Store(url), shards, fields=("cls", "npy", "jpg", "json") if where == "header" else
                      ("jpg", "cls", "json"))
    key = _flip(url, 1, 4, where)
    with make_loader(url, batch_size=4, num_workers=num_workers, verify_checksums=False, **RAW) as loader:
        assert sum(len(b["__key__"]) for b in loader) >= 15  # unchecked: served as it is
    with make_loader(url, batch_size=4, num_workers=num_workers, **RAW) as loader:
        with pytest.raises(ShardFormatError, match=r"shard-000001\.tar.*" + repr(key)):
            list(loader)


def _open_files_under(root: str) -> list[str]:
    """The files under `root` this process holds open (by what its descriptors point to: other
    threads, such as a session's S3 server, open and close descriptors of their own meanwhile)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith(os.path.realpath(root) + os.sep):
            found.append(target)
    return found


def test_shard_files_are_closed_when_the_iteration_ends(mixed_fields):
    assert _open_files_under(mixed_fields) == []
    with make_loader(mixed_fields, batch_size=4, num_workers=0, **RAW) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            for i, _ in enumerate(loader):
                if epoch == 1 and i == 2:
                    break  # a break closes too
    assert _open_files_under(mixed_fields) == []


def test_num_workers_0_lays_out_the_first_window_while_the_loader_is_built(mixed_fields, monkeypatch):
    """The first window's indexes and layout are made in a thread started by make_loader; the first
    iteration takes them instead of making them, and a start elsewhere (another epoch, a loaded
    state) drops them and delivers exactly what a loader without early start delivers."""
    from dataio.stream.raw import RawStream

    made: list[int] = []
    lay_out = RawStream._lay_out
    monkeypatch.setattr(RawStream, "_lay_out", lambda self, n: made.append(n) or lay_out(self, n))
    expected = summaries(mixed_fields, epochs=2, batch_size=4, num_workers=0, early_start=False)
    made.clear()
    with make_loader(mixed_fields, batch_size=4, num_workers=0, **RAW) as loader:
        _, _, stream = loader._dataloader.dataset._spare  # the bet on epoch 0 from its start
        stream._ahead.result(timeout=30)
        assert made == [0]  # laid out before any batch was asked for
        got = [[batch_summary(b) for b in loader]]
        assert made.count(0) == 1  # not again: the iteration adopted it
        loader.set_epoch(1)
        got.append([batch_summary(b) for b in loader])
    assert got == expected
    with make_loader(mixed_fields, batch_size=4, num_workers=0, **RAW) as loader:
        loader.set_epoch(1)  # the bet (epoch 0) loses: dropped at the first ticket
        assert [batch_summary(b) for b in loader] == expected[1]
    with make_loader(mixed_fields, batch_size=4, num_workers=0, **RAW) as loader:
        state = make_loader(mixed_fields, batch_size=4, num_workers=0, early_start=False, **RAW).state_dict()
        loader.load_state_dict(state)
        assert [batch_summary(b) for b in loader] == expected[0]
