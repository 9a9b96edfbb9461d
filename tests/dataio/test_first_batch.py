"""The early start (loader/first_batch.py): worker processes start when the loader is built, the
main process makes each iteration's first batch with several decode threads, the workers the rest.
Whatever the start-up path, the batches and their order are the same; states saved after the
hand-over resume exactly. No speed is asserted here (benchmarks/bench_first.py measures it)."""

from __future__ import annotations

import io

import numpy as np
import psutil
import pytest
from PIL import Image

from dataio import make_loader
from dataio.decode.cpu import CpuDecoder, DecodeConfig
from dataio.errors import CorruptSampleError
from tests.dataio.loader_helpers import ALL_KEYS, batch_summary, real_keys, take
from tests.dataio.resume_harness import check_save_load_state

pytestmark = pytest.mark.timeout(300)


def summaries(url: str, epochs: int = 2, **options) -> tuple[list[list[tuple]], int]:
    """(batch summaries per epoch, batches the main process made) of a fresh loader."""
    with make_loader(url, image_size=8, **options) as loader:
        out = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            out.append([batch_summary(b) for b in loader])
        made = loader._first.made if loader._first is not None else 0
    return out, made


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core machine: fine here
@pytest.mark.parametrize("num_workers,batch_size,shuffle_window,tail", [
    (2, 4, 4096, "pad"),
    (1, 5, 4096, "drop"),
    (3, 2, 3, "pad"),  # windows smaller than a batch: batch 0 spans two windows
    (2, 3, 2, "drop"),  # 3 is no multiple of 2: batch 0's windows hold more, the workers make it
])
def test_same_batches_whatever_the_start_up_path(dataset, num_workers, batch_size, shuffle_window, tail) -> None:
    options = dict(batch_size=batch_size, num_workers=num_workers, shuffle_window=shuffle_window, tail=tail, seed=7)
    early, made = summaries(dataset, early_start=True, **options)
    late, _ = summaries(dataset, early_start=False, **options)
    assert early == late  # keys, masks, labels, pixels, batch numbers: all of it, in order
    # One first batch per epoch made in the main process: local tar shards are read batch by batch
    # (stream/by_sample.py), so batch 0's samples are read alone whatever the windows. (Windows read
    # whole, from object storage, hold batch 0 alone only when shuffle_window >= batch_size or divides it.)
    assert made == 2


def test_workers_start_when_the_loader_is_built(dataset) -> None:
    me = psutil.Process()
    before = {p.pid for p in me.children()}
    with make_loader(dataset, batch_size=4, num_workers=2, image_size=8) as loader:
        started = [p for p in me.children() if p.pid not in before]
        assert len(started) == 2  # before any next()
        assert real_keys(list(loader)) and {p.pid for p in me.children()} - before == {p.pid for p in started}
    with make_loader(dataset, batch_size=4, num_workers=2, image_size=8, early_start=False) as loader:
        assert {p.pid for p in me.children()} - before == set()  # started by the first iteration
        take(loader, 1)
        assert len({p.pid for p in me.children()} - before) == 2


@pytest.mark.parametrize("stop", [1, 2])
def test_state_saved_after_the_hand_over_resumes_exactly(dataset, stop) -> None:
    options = dict(batch_size=3, image_size=8, tail="pad", shuffle_window=4096)
    used = check_save_load_state(lambda: [make_loader(dataset, num_workers=2, **options)], stop=stop,
                                 summary=batch_summary)
    assert used == stop


def test_a_loaded_state_beats_the_bet_made_at_build_time(dataset) -> None:
    """The workers bet on epoch 0 from its start; a state loaded before iterating wins."""
    options = dict(batch_size=4, image_size=8, tail="pad")
    with make_loader(dataset, num_workers=0, **options) as loader:
        head = take(loader, 3)
        state = loader.state_dict()
    rest = make_rest(dataset, state, num_workers=2, early_start=False, **options)
    resumed = make_rest(dataset, state, num_workers=2, **options)
    assert [batch_summary(b) for b in resumed] == [batch_summary(b) for b in rest]
    assert sorted(real_keys(head) + real_keys(resumed)) == sorted(ALL_KEYS)


def make_rest(url: str, state: dict, **options) -> list[dict]:
    with make_loader(url, **options) as loader:
        loader.load_state_dict(state)
        return list(loader)


def test_leaving_after_the_first_batch_then_iterating_again(dataset) -> None:
    """The workers' tickets go out from a thread while the caller holds the first batch."""
    options = dict(batch_size=4, tail="pad", num_workers=2)
    full, _ = summaries(dataset, epochs=1, **options)
    with make_loader(dataset, image_size=8, **options) as loader:
        first = [batch_summary(b) for b in take(loader, 1)]
        rest = [batch_summary(b) for b in loader]  # the same epoch continues after the first batch
    assert first + rest == full[0]


def jpeg(seed: int, size: int = 40) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (size, size + seed % 7, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG")
    return out.getvalue()


def test_decoding_in_threads_is_bit_for_bit_the_same() -> None:
    items = [jpeg(i) for i in range(9)]
    seeds = list(range(100, 109))
    one = CpuDecoder(DecodeConfig(size=16)).decode_batch(items, seeds=seeds)
    three = CpuDecoder(DecodeConfig(size=16), num_threads=3).decode_batch(items, seeds=seeds)
    assert np.array_equal(one.numpy(), three.numpy())


def test_decoding_in_threads_raises_the_first_bad_sample() -> None:
    items = [jpeg(i) for i in range(8)]
    items[3] = items[6] = b"\xff\xd8 not a jpeg"
    keys = [f"k{i}" for i in range(8)]
    with pytest.raises(CorruptSampleError, match="'k3'"):
        CpuDecoder(DecodeConfig(size=16), num_threads=4).decode_batch(items, seeds=list(range(8)), keys=keys)
    with pytest.raises(ValueError, match="num_threads"):
        CpuDecoder(DecodeConfig(size=16), num_threads=0)


@pytest.mark.slow  # spawned workers each import torch: seconds
def test_spawned_workers_take_over_after_the_first_batch(dataset) -> None:
    """With spawn the workers take seconds to start: the first batch is made meanwhile."""
    options = dict(batch_size=4, tail="pad", num_workers=1)
    spawned, made = summaries(dataset, epochs=1, multiprocessing_context="spawn", **options)
    forked, _ = summaries(dataset, epochs=1, early_start=False, **options)
    assert spawned == forked and made == 1


def test_a_new_iteration_while_an_old_one_holds_its_first_batch(dataset) -> None:
    """An iterator left open after its first batch (not closed) and a new iteration started."""
    options = dict(batch_size=4, tail="pad", num_workers=2)
    full, _ = summaries(dataset, epochs=1, **options)
    with make_loader(dataset, image_size=8, **options) as loader:
        old = iter(loader)
        first = batch_summary(next(old))
        rest = [batch_summary(b) for b in loader]  # continues after the one batch delivered
        with pytest.raises(RuntimeError, match="newer iteration"):
            next(old)
    assert [first, *rest] == full[0]
