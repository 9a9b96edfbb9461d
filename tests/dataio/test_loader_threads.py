"""RAW without per-sample objects, and reader threads in place of worker processes.

The RAW fast path (stream/raw.py: windows read into reused buffers, batches gathered by index)
delivers what the general path (a dict per sample) delivers; reader threads (worker_mode
"threads", the default for RAW tar) deliver what DataLoader worker processes deliver, in the same
order, with the same state, across a resume at another topology; reused buffers hold while the
caller holds the batch; a reader thread's error reaches the caller as itself; no thread outlives
an iteration's end or the loader's close.
"""

from __future__ import annotations

import hashlib
import threading
import time

import pytest

from dataio import make_loader
from dataio.errors import CorruptSampleError, ShardifyError
from dataio.storage.store import Store
from tests.dataio.loader_helpers import SIZES, TOTAL, batch_summary, summary_keys, take
from tests.dataio.resume_harness import check_resume, loader_advance, loader_deliver
from tests.dataio.shardgen import make_samples, write_tar_samples

pytestmark = pytest.mark.timeout(300)
RAW = dict(decode=None, seed=5, tail="pad")


def summaries(url: str, epochs: int = 2, **options) -> list[list[tuple]]:
    """Per epoch, batch_summary of every batch, each read as it arrives."""
    out = []
    with make_loader(url, rank=0, world_size=1, **{**RAW, **options}) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            out.append([batch_summary(b) for b in loader])
    return out


def reader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("dataio-reader", "dataio-raw-io"))]


@pytest.mark.parametrize("options", [
    dict(batch_size=4, shuffle_window=6),  # batches straddle windows
    dict(batch_size=5, shuffle_window=4096, tail="drop"),
    dict(batch_size=3, shuffle_window=2, fields=("jpg",)),  # projected (the label is still read)
    dict(batch_size=4, shuffle_window=7, shuffle=False, prefetch_bytes=1),  # no read-ahead budget
])
def test_the_raw_path_delivers_what_the_general_path_delivers(dataset, options):
    fast = summaries(dataset, num_workers=0, **options)
    general = summaries(dataset, num_workers=0, transform=lambda sample: sample, **options)  # a hook: sample dicts
    assert fast == general
    assert {k for b in fast[0] for k in summary_keys(b)} <= {f"{i:06d}" for i in range(TOTAL)}


@pytest.mark.parametrize("num_workers,reuse", [(2, False), (3, True)])
def test_reader_threads_deliver_what_worker_processes_deliver(dataset, num_workers, reuse):
    options = dict(batch_size=4, shuffle_window=6, num_workers=num_workers, reuse_buffers=reuse)
    threads = summaries(dataset, worker_mode="threads", **options)
    processes = summaries(dataset, worker_mode="processes", multiprocessing_context="fork", **options)
    assert threads == processes
    with make_loader(dataset, rank=0, world_size=1, batch_size=4, **RAW, num_workers=2) as loader:
        assert loader.execution.readers == "threads"  # the default for RAW tar
    assert not reader_threads()


def resumed_run(url: str, mode: str, base: dict | None = None) -> tuple[list[str], list[dict]]:
    """Stop at (world 2, 2 workers) after 3 batches, resume at (world 1, 3 workers) to the end: the
    keys delivered and every state saved on the way; loader options `base` (RAW's by default)."""
    options = dict(base or RAW, batch_size=2, shuffle_window=5, worker_mode=mode, multiprocessing_context="fork")

    def make_at(topology):
        world_size, num_workers = topology
        return [make_loader(url, rank=r, world_size=world_size, num_workers=num_workers, **options)
                for r in range(world_size)]

    states: list[dict] = []
    advance = loader_advance(make_at)

    def recording_advance(state, topology, batches):
        states.append(advance(state, topology, batches))
        return states[-1]

    delivered, _ = check_resume(loader_deliver(make_at, batch_summary), recording_advance, summary_keys, None,
                                [((2, 2), 3), ((1, 3), None)])
    return delivered, states


def test_resume_at_another_topology_is_the_same_in_threads_and_processes(dataset):
    threads = resumed_run(dataset, "threads")
    assert sorted(threads[0]) == sorted(f"{i:06d}" for i in range(TOTAL))
    assert threads == resumed_run(dataset, "processes")


def test_reused_buffers_hold_while_the_caller_holds_the_batch(dataset):
    expected = summaries(dataset, epochs=1, batch_size=4, num_workers=2)[0]
    with make_loader(dataset, rank=0, world_size=1, batch_size=4, num_workers=2, reuse_buffers=True,
                     prefetch_factor=1, **RAW) as loader:
        got = []
        for batch in loader:
            before = hashlib.sha1(batch["jpg"].data.numpy().tobytes()).hexdigest()
            time.sleep(0.02)  # the threads run ahead meanwhile
            assert hashlib.sha1(batch["jpg"].data.numpy().tobytes()).hexdigest() == before
            got.append(batch_summary(batch))
    assert got == expected


def test_fresh_buffers_may_be_kept(dataset):
    """reuse_buffers=False (the default): list(loader) keeps every batch's bytes intact."""
    with make_loader(dataset, rank=0, world_size=1, batch_size=4, num_workers=2, **RAW) as loader:
        kept = [batch_summary(b) for b in list(loader)]
    assert kept == summaries(dataset, epochs=1, batch_size=4, num_workers=2, worker_mode="processes")[0]


def write_with(tmp_path, change) -> str:
    """A tar dataset of SIZES whose samples `change(shards)` edited in place."""
    shards = make_samples(SIZES, real_images=True)
    change(shards)
    url = str(tmp_path / "ds")
    write_tar_samples(Store(url), shards)
    return url


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_a_bad_label_in_a_reader_thread_surfaces_with_url_and_key(tmp_path, mode):
    def bad_label(shards):
        shards[4][3]["cls"] = b"seven"

    url = write_with(tmp_path, bad_label)
    with make_loader(url, rank=0, world_size=1, batch_size=4, num_workers=2, worker_mode=mode, **RAW) as loader:
        with pytest.raises(CorruptSampleError, match=r"shard-000004\.tar.*sample '000024'.*not an integer"):
            list(loader)
    assert not reader_threads()


def test_a_bad_json_field_is_skipped_as_in_processes(tmp_path):
    def bad_json(shards):
        shards[0][2]["json"] = b"{not json"

    url = write_with(tmp_path, bad_json)
    runs = [summaries(url, epochs=1, batch_size=4, num_workers=2, worker_mode=mode, on_corrupt="skip",
                      multiprocessing_context="fork") for mode in ("threads", "processes")]
    assert runs[0] == runs[1]
    with make_loader(url, rank=0, world_size=1, batch_size=4, num_workers=2, **RAW) as loader:
        with pytest.raises(CorruptSampleError, match=r"shard-000000\.tar.*sample '000002'"):
            list(loader)


def test_a_truncated_shard_fails_in_the_caller_naming_its_url(tmp_path):
    url = write_with(tmp_path, lambda shards: None)
    path = tmp_path / "ds" / "shards" / "shard-000004.tar"
    path.write_bytes(path.read_bytes()[:2000])
    with make_loader(url, rank=0, world_size=1, batch_size=4, num_workers=2, check_shards=False, **RAW) as loader:
        with pytest.raises(ShardifyError, match=r"shard-000004\.tar"):
            list(loader)
    assert not reader_threads()


def test_no_thread_outlives_a_break_or_close(dataset):
    loader = make_loader(dataset, rank=0, world_size=1, batch_size=2, num_workers=2, **RAW)
    assert len(take(loader, 2)) == 2  # the iterator is dropped mid-epoch
    loader.set_epoch(1)
    it = iter(loader)
    next(it)
    assert reader_threads()
    loader.close()
    assert not reader_threads()
    with make_loader(dataset, rank=0, world_size=1, batch_size=2, num_workers=2, **RAW) as loader:
        list(loader)
        assert not reader_threads()  # an iteration that ends stops its threads


def test_worker_mode_is_checked():
    from dataio import LoaderConfig

    with pytest.raises(ValueError, match="worker_mode"):
        LoaderConfig.from_options(batch_size=4, worker_mode="fibers")
    with pytest.raises(ValueError, match="decode=None or 'cpu'"):
        LoaderConfig.from_options(batch_size=4, decode="dali", worker_mode="threads")


def test_decoding_and_parquet_keep_worker_processes(dataset, tmp_path):
    from tests.dataio.shardgen import write_parquet_dataset

    with make_loader(dataset, rank=0, world_size=1, batch_size=4, num_workers=2, image_size=8) as loader:
        assert loader.execution.readers == "processes"
    url = str(tmp_path / "pq")
    write_parquet_dataset(Store(url), [5, 3], row_group_size=2)
    with make_loader(url, rank=0, world_size=1, batch_size=4, num_workers=2, decode=None) as loader:
        assert loader.execution.readers == "processes"
    with make_loader(url, rank=0, world_size=1, batch_size=4, num_workers=2, decode=None,
                     worker_mode="threads") as loader:
        assert loader.execution.readers == "threads" and sum(int(b["mask"].sum()) for b in loader) == 8
