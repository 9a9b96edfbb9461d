"""ShardLoader.skip(ids): the samples are never delivered again, at any topology, in any later epoch,
and the saved state keeps skipping; one dataset and a mixture."""

from __future__ import annotations

import pytest

from dataio import Source, make_loader
from dataio.storage.store import Store
from tests.dataio.loader_helpers import take
from tests.dataio.shardgen import write_parquet_dataset, write_tar_dataset

TAR_SIZES = [13, 0, 7, 1, 22, 5]  # 48
PARQUET_SIZES = [10, 6]  # 16


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("skip")
    tar, parquet = str(root / "tar"), str(root / "parquet")
    write_tar_dataset(Store(tar), TAR_SIZES)
    write_parquet_dataset(Store(parquet), PARQUET_SIZES, seed=1)
    return tar, parquet


def ids_of(batches, base=(0, 48)):
    """Global ids of the real samples (keys number each source's samples in order)."""
    out = []
    for b in batches:
        sources = b["source"].tolist() if "source" in b else [0] * len(b["__key__"])
        masks = b["mask"].tolist() if "mask" in b else [True] * len(b["__key__"])
        out += [base[s] + int(k) for s, k, m in zip(sources, b["__key__"], masks) if m]
    return out


@pytest.mark.parametrize("mixed", [False, True])
def test_skipped_samples_never_come_again_at_another_topology(sources, mixed) -> None:
    url = [Source(u, repeat=1.0) for u in sources] if mixed else sources[0]  # each sample once an epoch
    options = dict(batch_size=4, decode=None, shuffle_window=8, seed=3)
    with make_loader(url, num_workers=2, world_size=1, rank=0, **options) as loader:
        first = ids_of(take(loader, 3))
        state = loader.state_dict()
    total = 64 if mixed else 48
    skip = [i for i in range(total) if i % 7 == 0 and i not in first]
    rest, states = [], []
    for rank in range(2):  # resumed on 2 ranks, 1 worker each
        with make_loader(url, num_workers=0, world_size=2, rank=rank, **options) as loader:
            loader.load_state_dict(state)
            loader.skip(skip)
            steps = len(loader)
            assert loader.skipped and steps > 0
            batches = list(loader)
            assert len(batches) == steps  # len() and the plan agree on the shorter epoch
            rest += ids_of(batches)
            states.append(loader.state_dict())
    assert not set(skip) & set(rest)
    delivered = first + rest
    assert len(delivered) == len(set(delivered))
    assert total - len(skip) - len(delivered) < 2 * 4  # only the tail below one global batch
    with make_loader(url, num_workers=2, world_size=1, rank=0, worker_mode="processes", **options) as loader:
        loader.load_state_dict(states[0])  # saved after the epoch: the next ones keep skipping
        for epoch in (1, 2):  # epoch 2: the worker processes' bet on the next epoch keeps the skip too
            loader.set_epoch(epoch)
            steps = len(loader)
            batches = list(loader)
            assert len(batches) == steps
            later = ids_of(batches)
            assert not set(skip) & set(later) and len(later) == len(set(later))
            assert total - len(skip) - len(later) < 4


def test_skip_refuses_ids_outside_the_data_and_mid_iteration(sources) -> None:
    with make_loader(sources[0], batch_size=4, decode=None) as loader:
        with pytest.raises(ValueError, match="cannot skip sample id 48: ids of this data run from 0 to 47"):
            loader.skip([3, 48])
        it = iter(loader)
        next(it)
        with pytest.raises(RuntimeError, match="between iterations"):
            loader.skip([1])


def test_an_epoch_end_state_taken_for_its_history_keeps_the_skip_list(sources) -> None:
    options = dict(batch_size=4, decode=None, shuffle_window=8, seed=3)
    with make_loader(sources[0], **options) as loader:
        loader.skip(range(0, 48, 2))
        list(loader)
        state = loader.state_dict()  # after the epoch's last batch
    with make_loader(sources[0], **options) as loader:
        loader.load_history(state)  # what the trainer does with an epoch-end checkpoint
        loader.set_epoch(1)
        assert loader.skipped == tuple((i, i + 1) for i in range(0, 48, 2))
        assert all(i % 2 for i in ids_of(list(loader)))


def test_skipping_what_is_skipped_already_changes_nothing(sources) -> None:
    options = dict(batch_size=4, decode=None, shuffle_window=8, seed=3)
    with make_loader(sources[0], **options) as loader:
        take(loader, 2)
        loader.skip([5, 6, 7])
        state = loader.state_dict()
    with make_loader(sources[0], **options) as a, make_loader(sources[0], **options) as b:
        a.load_state_dict(state)
        b.load_state_dict(state)
        b.skip([6, 7])  # a relaunch with the same flag
        assert b.state_dict() == state and ids_of(list(a)) == ids_of(list(b))


def test_decoded_batches_in_worker_processes_skip_too(tmp_path) -> None:
    url = str(tmp_path / "images")
    write_tar_dataset(Store(url), [13, 7, 22, 5], real_images=True)
    options = dict(batch_size=4, image_size=16, seed=2, shuffle_window=8, num_workers=2)  # decode="cpu"
    with make_loader(url, **options) as loader:
        it = iter(loader)
        first = ids_of([next(it) for _ in range(2)])
        it.close()
        state = loader.state_dict()
    skip = [i for i in range(47) if i % 3 == 0 and i not in first]
    with make_loader(url, **options) as loader:
        loader.load_state_dict(state)
        loader.skip(skip)  # the main process makes the first batch, the workers the rest (first_batch.py)
        steps = len(loader)
        batches = list(loader)
    rest = ids_of(batches)
    assert len(batches) == steps and not set(skip) & set(rest)
    assert len(first + rest) == len(set(first + rest)) and 47 - len(skip) - len(first + rest) < 4
