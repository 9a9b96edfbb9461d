"""The loader's state: resume on the same or another topology, refusals, DCP, start-up agreement."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from dataio import ManifestError, ShardifyError, StateError, make_loader
from dataio.loader.startup import agree_on_dataset
from dataio.storage.store import Store
from tests.dataio.loader_helpers import TOTAL, real_keys, run_epoch, take
from tests.dataio.shardgen import write_tar_dataset


def test_state_round_trip_resumes_exactly_the_rest(dataset) -> None:
    options = dict(batch_size=3, num_workers=2, decode=None, shuffle_window=5)
    full, _ = run_epoch(dataset, **options)
    with make_loader(dataset, **options) as loader:
        head = take(loader, 4)
        state = json.loads(json.dumps(loader.state_dict()))  # plain JSON survives any checkpoint
    with make_loader(dataset, **options) as resumed:
        resumed.load_state_dict(state)
        resumed.set_epoch(0)  # the saved epoch: keeps the position
        assert len(resumed) == len(full) - 4
        rest = list(resumed)
    assert [b["__key__"] for b in head + rest] == [b["__key__"] for b in full]
    assert [b["batch_number"] for b in rest] == list(range(4, len(full)))


def test_breaking_out_and_iterating_again_continues(dataset) -> None:
    options = dict(batch_size=4, num_workers=1, decode=None)
    full, _ = run_epoch(dataset, **options)
    with make_loader(dataset, **options) as loader:
        head = take(loader, 2)
        rest = list(loader)
        assert json.loads(loader.state_dict()["plan"])["progress"][-1]["batches"] == len(full)
        loader.set_epoch(1)
        assert len(loader) == len(full)
    assert real_keys(head + rest) == real_keys(full)


def test_resume_on_another_topology_in_one_process(dataset) -> None:
    options = dict(batch_size=3, decode=None, shuffle_window=4)
    loaders = [make_loader(dataset, rank=r, world_size=2, num_workers=2, **options) for r in range(2)]
    delivered = [k for loader in loaders for k in real_keys(take(loader, 2))]
    states = [loader.state_dict() for loader in loaders]
    for loader in loaders:
        loader.close()
    assert states[0] == states[1]  # every rank's state is the same
    steps = set()
    for rank in range(3):
        with make_loader(dataset, rank=rank, world_size=3, num_workers=0, **options) as loader:
            loader.load_state_dict(states[0])
            batches = list(loader)
            steps.add(len(batches))
            delivered += real_keys(batches)
    assert len(delivered) == len(set(delivered)) and TOTAL - len(delivered) < 3 * 3
    assert len(steps) == 1


def test_refused_states_say_what_differs(dataset, tmp_path) -> None:
    with make_loader(dataset, batch_size=4, num_workers=0, decode=None) as loader:
        take(loader, 1)
        good = loader.state_dict()
    other = str(tmp_path / "other")
    write_tar_dataset(Store(other), [3, 4])
    cases = [
        (dict(url=other), "fingerprint"),
        (dict(seed=1), "seed"),
        (dict(batch_size=5), "batch size"),
        (dict(tail="pad"), "tail"),
    ]
    for change, word in cases:
        options = dict(url=dataset, batch_size=4, num_workers=0, decode=None) | change
        with make_loader(options.pop("url"), **options) as loader, pytest.raises(StateError, match=word):
            loader.load_state_dict(good)
    plan = json.loads(good["plan"])
    with make_loader(dataset, batch_size=4, num_workers=0, decode=None) as loader:
        for broken, word in [
            (good | {"plan": json.dumps(plan | {"plan_version": 99})}, "plan version"),
            (good | {"format_version": 7}, "format version"),
            (good | {"plan": plan | {"progress": [{"world_size": 1, "num_workers": 1, "batches": 999}]}},
             "999 batches"),
            (good | {"plan": "{not json"}, "not valid JSON"),
            ("not a state", "must be a dict"),
        ]:
            with pytest.raises(StateError, match=word):
                loader.load_state_dict(broken)
        loader.load_state_dict(good)  # still usable after refusals
        assert len(loader) == TOTAL // 4 - 1


def test_a_plan_version_1_state_loads_only_at_an_epoch_boundary(dataset) -> None:
    # Version 1 used full shuffle windows from a run's start; version 2's grow from one batch, so a
    # mid-epoch position of version 1 cannot be replayed, but one where nothing is pending can.
    with make_loader(dataset, batch_size=4, num_workers=0, decode=None) as loader:
        take(loader, 1)
        mid = loader.state_dict()
        list(loader)
        end = loader.state_dict()
    fresh = make_loader(dataset, batch_size=4, num_workers=0, decode=None).state_dict()
    old = [s | {"plan": json.dumps(json.loads(s["plan"]) | {"plan_version": 1})} for s in (mid, end, fresh)]
    with make_loader(dataset, batch_size=4, num_workers=0, decode=None) as loader:
        with pytest.raises(StateError, match="plan version 1, this shardify uses 2"):
            loader.load_state_dict(old[0])
        loader.load_state_dict(old[1])  # after the epoch's last batch: the next epoch, whole
        assert loader.epoch == 1 and len(loader) == TOTAL // 4
        loader.load_state_dict(old[2])  # before the first batch: the whole epoch
        assert loader.epoch == 0 and len(loader) == TOTAL // 4


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_distributed_checkpoint_saves_and_resumes_the_loader(dataset, tmp_path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.stateful import Stateful

    options = dict(batch_size=4, num_workers=0, decode=None, tail="pad")
    full, _ = run_epoch(dataset, **options)
    with make_loader(dataset, **options) as loader:
        assert isinstance(loader, Stateful)
        head = take(loader, 3)
        dcp.save({"loader": loader}, checkpoint_id=str(tmp_path / "ckpt"))
    with make_loader(dataset, **options) as resumed:  # a fresh loader's state is the template
        dcp.load({"loader": resumed}, checkpoint_id=str(tmp_path / "ckpt"))
        rest = list(resumed)
    assert real_keys(head + rest) == real_keys(full)


def agree_in_threads(outcomes: list) -> dict[int, object]:
    """Run agree_on_dataset for len(outcomes) ranks as threads over one in-memory store."""
    kv = torch.distributed.HashStore()
    results: dict[int, object] = {}

    def rank_main(rank: int) -> None:
        def opener():
            if isinstance(outcomes[rank], Exception):
                raise outcomes[rank]
            return rank, outcomes[rank]

        try:
            results[rank] = agree_on_dataset(opener, rank=rank, world_size=len(outcomes), timeout_s=5, kv_store=kv)
        except Exception as exc:  # noqa: BLE001 - recorded for the assertions
            results[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(outcomes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


def test_ranks_agree_on_the_dataset_or_all_fail() -> None:
    assert agree_in_threads(["fp", "fp", "fp"]) == {0: 0, 1: 1, 2: 2}
    results = agree_in_threads(["fp", "other"])
    assert all(isinstance(r, ManifestError) and "different datasets" in str(r) for r in results.values())
    results = agree_in_threads(["fp", ManifestError("s3://b/ds/manifest.json does not exist")])
    assert isinstance(results[1], ManifestError)
    assert isinstance(results[0], ShardifyError) and "rank 1 could not open" in str(results[0])
