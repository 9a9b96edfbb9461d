"""Skipped samples in the plan (plan/skip.py): nothing skipped is delivered, everything else exactly
once but a tail, equal steps, at any topology and stop point, and in every later epoch."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataio.errors import StateError
from dataio.plan.plan import num_steps
from dataio.plan.skip import ids_to_ranges, in_ranges
from dataio.plan.mix import MixState
from dataio.plan.types import PlanConfig, PlanState, Skip
from tests.dataio.plan_harness import configs, plan_advance, plan_epoch, real_ids, shard_sizes
from tests.dataio.test_plan_mix import mix_epoch, mixtures

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
topologies = st.tuples(st.one_of(st.integers(1, 4), st.sampled_from([7])), st.integers(1, 4))


def run(sizes, config, state, topology, stop=None):
    """(ids delivered, state after): the first `stop` batches per rank (None: to the epoch's end)."""
    per_rank = plan_epoch(sizes, config, world_size=topology[0], num_workers=topology[1], state=state)
    steps = len(per_rank[0])  # equal steps: plan_epoch checks every worker against num_steps
    stop = steps if stop is None else min(stop, steps)
    ids = [i for batches in per_rank for b in batches[:stop] for i in real_ids(b)]
    return ids, plan_advance(state, topology, stop)


def check_epoch(delivered, total, gone, config, final_world_size):
    """Exactly once over the samples not in `gone`; only a tail below one global batch missing."""
    assert len(delivered) == len(set(delivered))
    expected = set(range(total)) - gone
    assert set(delivered) <= expected
    missing = len(expected) - len(delivered)
    assert missing == 0 if config.tail == "pad" else missing < final_world_size * config.batch_size


@SETTINGS
@given(sizes=shard_sizes, config=configs(), path=st.lists(topologies, min_size=3, max_size=3), data=st.data())
def test_skipped_ids_never_come_and_the_rest_comes_once(sizes, config, path, data):
    total = sum(sizes)
    skip = set(data.draw(st.lists(st.integers(0, max(0, total - 1)), max_size=20), label="skip")) if total else set()
    state = PlanState(epoch=data.draw(st.integers(0, 3), label="epoch"))
    first, state = run(sizes, config, state, path[0], data.draw(st.integers(0, 8), label="stop1"))
    state = PlanState.from_dict(state.skipping(ids_to_ranges(sorted(skip))).to_dict())
    second, state = run(sizes, config, state, path[1], data.draw(st.integers(0, 8), label="stop2"))
    third, state = run(sizes, config, state, path[2])  # resumed again: the state keeps skipping
    after = second + third
    assert not skip & set(after)
    check_epoch(first + after, total, skip - set(first), config, path[2][0])
    # A later epoch drops every skipped id from its start: it shrinks by their count.
    nxt = state.next_epoch(state.epoch + 1)
    assert nxt.skipped_ids() == ids_to_ranges(sorted(skip))
    later, _ = run(sizes, config, nxt, path[1])
    check_epoch(later, total, skip, config, path[1][0])


def test_a_same_topology_resume_with_a_skip_starts_a_fresh_level():
    sizes, config = [40, 7, 0, 33], PlanConfig(seed=9, batch_size=4, shuffle_window=8)
    state = PlanState(epoch=0)
    first, state = run(sizes, config, state, (2, 2), 3)
    skip = {i for i in range(80) if i % 5 == 0} - set(first)
    state = state.skipping(ids_to_ranges(sorted(skip)))
    rest, state = run(sizes, config, state, (2, 2))
    assert not skip & set(rest) and len(state.progress) == 2  # the filter sits between the two levels
    check_epoch(first + rest, 80, skip, config, 2)


def test_states_without_a_skip_keep_their_dict_and_a_skip_round_trips():
    state = PlanState(epoch=2).advanced(world_size=2, num_workers=1, batches=3)
    assert set(state.to_dict()) == {"plan_version", "epoch", "progress"}
    skipping = state.skipping([(5, 9), (9, 12), (40, 41)])
    assert skipping.skip == (Skip(level=1, ranges=((5, 12), (40, 41))),)
    assert PlanState.from_dict(skipping.to_dict()) == skipping
    with pytest.raises(StateError, match="malformed plan state"):
        PlanState.from_dict({**skipping.to_dict(), "skip": [{"level": 5, "ids": [[1, 2]]}]})


def test_ranges_are_compact():
    assert ids_to_ranges([7, 3, 4, 5, 9, 3]) == ((3, 6), (7, 8), (9, 10))
    import numpy as np
    assert in_ranges(np.arange(11), ((3, 6), (9, 10))).tolist() == [i in (3, 4, 5, 9) for i in range(11)]


def test_an_epoch_shrinks_by_the_skipped_count():
    sizes, config = [50, 50], PlanConfig(seed=1, batch_size=5)
    state = PlanState(epoch=0).skipping([(0, 10)]).next_epoch(1)
    assert num_steps(sizes, config=config, world_size=2, state=state) == 9  # 90 samples / 10


@SETTINGS
@given(mixture=mixtures(), config=configs(), path=st.lists(topologies, min_size=2, max_size=2), data=st.data())
def test_a_mixture_skips_every_draw_of_a_skipped_id(mixture, config, path, data):
    """Draws (source, k) instead of ids: an upsampled id has several, and the filter drops all of them."""
    start = MixState.start(mixture, 0)
    total = int(mixture.id_base[-1])
    skip = set(data.draw(st.lists(st.integers(0, max(0, total - 1)), max_size=12), label="skip")) if total else set()
    per_rank = mix_epoch(mixture, config, world_size=path[0][0], num_workers=path[0][1], state=start)
    stop = data.draw(st.integers(0, len(per_rank[0])), label="stop")
    # The epoch as delivered is rounded to the global batch of the topology that starts it (mix.py).
    first = path[0] if stop else path[1]
    whole = [(s, k, i) for batches in mix_epoch(mixture, config, world_size=first[0], num_workers=first[1],
                                                state=start) for b in batches for (s, k, i), pad in zip(*b) if not pad]
    head = [(s, k, i) for batches in per_rank for b in batches[:stop] for (s, k, i), pad in zip(*b) if not pad]
    state = start.advanced(world_size=path[0][0], num_workers=path[0][1], batches=stop)
    state = MixState(plan=PlanState.from_dict(state.plan.skipping(ids_to_ranges(sorted(skip))).to_dict()),
                     mixture=state.mixture)
    rest = [(s, k, i) for batches in mix_epoch(mixture, config, world_size=path[1][0], num_workers=path[1][1],
                                               state=state) for b in batches for (s, k, i), pad in zip(*b) if not pad]
    assert not skip & {i for _, _, i in rest}
    got = [(s, k) for s, k, _ in head + rest]
    assert len(got) == len(set(got)) and set(got) <= {(s, k) for s, k, _ in whole}
    gone = {(s, k) for s, k, i in whole if i in skip} - set(got)  # skipped draws not delivered before the skip
    missing = len(whole) - len(got) - len(gone)
    assert missing == 0 if config.tail == "pad" else 0 <= missing < path[1][0] * config.batch_size


def test_a_scheduled_mixture_skips_in_the_segment_in_progress_and_every_later_one():
    import numpy as np

    from dataio.plan.mix import MixSource, mix_num_steps, plan_mix_worker
    from dataio.plan.schedule import Piece, scheduled
    from dataio.plan.types import WorkerSlot

    # 120 an epoch, segments of 60 (0.5 / 0.5) + 60 (0.4 / 0.6): no source passes its 70 samples in epoch 0
    sources = (MixSource(name="a", shard_sizes=[25, 45]), MixSource(name="b", shard_sizes=[40, 30]))
    mixture = scheduled(sources, (Piece((0.5, 0.5), 60), Piece((0.4, 0.6), 60), Piece((0.5, 0.5))), 120)
    config = PlanConfig(seed=5, batch_size=2, shuffle_window=6)
    skip = set(range(0, 120, 7))

    def ids(state, topology, stop=None):
        """Every rank's ids of the first `stop` batches (None: all), and the state after them."""
        steps = mix_num_steps(mixture, config=config, world_size=topology[0], state=state)
        stop = steps if stop is None else stop
        got = []
        for rank in range(topology[0]):
            by_number = {}
            for w in range(topology[1]):
                slot = WorkerSlot(rank=rank, world_size=topology[0], worker_id=w, num_workers=topology[1])
                plan = plan_mix_worker(mixture, config=config, slot=slot, state=state)
                assert plan.num_steps == steps  # equal steps
                flat = np.concatenate([x.sample_ids for x in plan.windows]) if plan.windows else np.zeros(0)
                for j, number in enumerate(plan.batch_numbers.tolist()):
                    by_number[number] = flat[j * config.batch_size:(j + 1) * config.batch_size].tolist()
            got += [i for number in range(stop) for i in by_number[number]]
        return got, state.advanced(world_size=topology[0], num_workers=topology[1], batches=stop)

    start = MixState.start(mixture, 0)
    whole, _ = ids(start, (2, 1))
    for stop in (0, 3, 14, 16, 29):  # in segment 0, at its end, in segment 1
        head, state = ids(start, (2, 1), stop)
        state = MixState(plan=PlanState.from_dict(state.plan.skipping(ids_to_ranges(sorted(skip))).to_dict()),
                         mixture=state.mixture)
        for topology in ((3, 2), (2, 1)):
            rest, end = ids(state, topology)
            assert not skip & set(rest) and len(head + rest) == len(set(head + rest))
            assert set(head + rest) <= set(whole)
            missing = len(set(whole) - set(head) - skip) - len(rest)
            assert 0 <= missing < 2 * topology[0] * config.batch_size  # a new tail in each segment at most
            nxt, _ = ids(MixState(plan=end.plan.next_epoch(1), mixture=end.mixture), topology)
            assert not skip & set(nxt)  # (epoch 1 starts new passes mid-epoch: repeats are the plan's own)


def test_a_mixture_of_one_counts_steps_as_its_single_dataset_plan_skips():
    from dataio.plan.mix import MixSource, Mixture, MixState, plan_mix_worker
    from dataio.plan.types import WorkerSlot

    sizes = [13, 7, 22, 5]
    one = Mixture(sources=(MixSource(name="a", shard_sizes=sizes),))
    assert one.single
    for seed in range(8):
        config = PlanConfig(seed=seed, batch_size=4, shuffle_window=8)
        state = PlanState(epoch=0).advanced(world_size=1, num_workers=2, batches=2).skipping([(6, 7), (9, 31)])
        steps = one.steps_from(config=config, world_size=1, state=state)
        assert steps == num_steps(sizes, config=config, world_size=1, state=state)
        slot = WorkerSlot(rank=0, world_size=1, worker_id=0, num_workers=2)
        plan = plan_mix_worker(one, config=config, slot=slot, state=MixState(plan=state, mixture=one.describe()))
        assert plan.num_steps == steps
