"""The mixture plan (dataio/plan/mix.py): exact per-source counts, smooth interleaving, and the five
plan properties of DESIGN.md over a mixture, all ranks in one process (resume_harness's checks)."""

from __future__ import annotations

import json
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dataio import StateError
from dataio.plan.interleave import Interleave
from dataio.plan.mix import (
    MIX_VERSION,
    MixEpoch,
    MixSource,
    MixState,
    Mixture,
    MixWindow,
    mix_num_steps,
    plan_mix_worker,
)
from dataio.plan.plan import num_steps, plan_worker, shard_offsets
from dataio.plan.types import PlanConfig, PlanState, WorkerSlot
from tests.dataio.plan_harness import configs, shard_sizes as sizes_of_shards
from tests.dataio.test_interleave import prefix_table
from tests.dataio.resume_harness import check_resume, check_same_topology_resume

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
shard_sizes = st.lists(st.one_of(st.sampled_from([0, 1]), st.integers(0, 12), st.integers(13, 60)), max_size=6)
world_sizes = st.one_of(st.integers(1, 4), st.sampled_from([7, 16, 64]))
topologies = st.tuples(st.one_of(st.integers(1, 5), st.sampled_from([8, 64])), st.integers(1, 8))


@st.composite
def mixtures(draw: st.DrawFn, max_sources: int = 4) -> Mixture:
    """1-4 sources, empty and tiny ones included, weighted or repeated, epochs up- or down-sampled."""
    sources = []
    for i in range(draw(st.integers(1, max_sources))):
        sizes = draw(shard_sizes)
        if draw(st.booleans()) or i == 0:
            kind = {"weight": draw(st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.5, 7.0]))}
        else:
            kind = {"repeat": draw(st.sampled_from([0.0, 0.3, 1.0, 2.0]))}
        sources.append(MixSource(name=f"s{i}", shard_sizes=sizes, fingerprint=f"fp{i}", **kind))
    epoch_samples = draw(st.one_of(st.none(), st.integers(0, 400)))
    try:
        mixture = Mixture(sources=tuple(sources), epoch_samples=epoch_samples)
    except ValueError:
        assume(False)
        raise
    assume(not mixture.single)  # a mixture of one is the single-dataset plan (test_mixture_of_one_...)
    return mixture


Key = tuple[int, int, int]  # (source, draw k this epoch, global id)
Batch = tuple[tuple[Key, ...], tuple[bool, ...]]


def mix_epoch(mixture: Mixture, config: PlanConfig, *, world_size: int, num_workers: int,
              state: MixState) -> list[list[Batch]]:
    """Per rank, its batches from the state's position on; each worker plan checked on the way."""
    steps = mix_num_steps(mixture, config=config, world_size=world_size, state=state)
    offsets = shard_offsets(mixture.shard_sizes)
    per_rank = []
    for rank in range(world_size):
        by_number: dict[int, Batch] = {}
        for worker_id in range(num_workers):
            slot = WorkerSlot(rank=rank, world_size=world_size, worker_id=worker_id, num_workers=num_workers)
            plan = plan_mix_worker(mixture, config=config, slot=slot, state=state)
            assert plan.num_steps == steps
            assert np.array_equal(plan.batch_numbers, np.arange(worker_id, steps, num_workers))
            keys: list[Key] = []
            pads: list[bool] = []
            for w in plan.windows:
                assert isinstance(w, MixWindow)
                check_window(mixture, config, state.plan.epoch, offsets, w)
                keys += zip(w.source.tolist(), w.draw.tolist(), w.sample_ids.tolist())
                pads += w.is_pad.tolist()
            B = config.batch_size
            assert len(keys) == len(plan.batch_numbers) * B
            for i, j in enumerate(plan.batch_numbers.tolist()):
                by_number[j] = (tuple(keys[i * B:(i + 1) * B]), tuple(pads[i * B:(i + 1) * B]))
        per_rank.append([by_number[j] for j in range(steps)])
    return per_rank


def check_window(mixture: Mixture, config: PlanConfig, epoch: int, offsets: np.ndarray, w: MixWindow) -> None:
    """Ids are the sources' draws, inside the source's own shards, covered by front-to-back segments."""
    for s in np.unique(w.source).tolist():
        sel = w.source == s
        assert 0 <= w.draw[sel].min() and w.draw[sel].max() < mixture.counts[s]
        assert np.array_equal(w.sample_ids[sel], mixture.draw_ids(s, w.draw[sel], config=config, epoch=epoch))
        assert (mixture.id_base[s] <= w.sample_ids[sel]).all() and (w.sample_ids[sel] < mixture.id_base[s + 1]).all()
    covered, last_stop = set(), {}
    for seg in w.segments:
        assert 0 <= seg.start < seg.stop <= mixture.shard_sizes[seg.shard]
        assert seg.start >= last_stop.get(seg.shard, 0), "segments not front to back"
        last_stop[seg.shard] = seg.stop
        covered.update(range(offsets[seg.shard] + seg.start, offsets[seg.shard] + seg.stop))
    assert covered >= set(w.sample_ids.tolist())


def real_keys(batch: Batch) -> list[tuple[int, int]]:
    return [(s, k) for (s, k, _), pad in zip(*batch) if not pad]


def deliver(mixture: Mixture, config: PlanConfig):
    return lambda state, topo: mix_epoch(mixture, config, world_size=topo[0], num_workers=topo[1], state=state)


def advance(state: MixState, topo: tuple[int, int], batches: int) -> MixState:
    nxt = state.advanced(world_size=topo[0], num_workers=topo[1], batches=batches)
    return MixState.from_dict(json.loads(json.dumps(nxt.to_dict())))  # as a checkpoint does


def epoch_keys(mixture: Mixture | MixEpoch, length: int) -> list[tuple[int, int]]:
    source, k = mixture.locate(np.arange(length))
    return list(zip(source.tolist(), k.tolist()))


def as_delivered(mixture: Mixture, config: PlanConfig, world_size: int) -> MixEpoch:
    """The epoch an epoch started at `world_size` delivers (rounded down to its global batch if dropping)."""
    return mixture.epoch(world_size * config.batch_size if config.tail == "drop" else 1)


def assert_complete(mixture: Mixture, config: PlanConfig, delivered: list[tuple[int, int]], last_world_size: int,
                    first_world_size: int):
    """Every slot of the epoch as delivered at most once; all of them (pad, or drop without a
    resume at another world size) or all but less than one global batch (drop)."""
    assert len(delivered) == len(set(delivered))
    epoch = as_delivered(mixture, config, first_world_size)
    assert epoch.total % (first_world_size * config.batch_size if config.tail == "drop" else 1) == 0
    everything = set(epoch_keys(epoch, epoch.total))
    assert set(delivered) <= everything
    if config.tail == "pad" or first_world_size == last_world_size:
        assert set(delivered) == everything
    else:
        assert len(everything) - len(delivered) < last_world_size * config.batch_size


def assert_largest_remainder(mixture: Mixture, counts: list[int], total: int) -> None:
    """`counts` are an epoch of `total`'s shares: repeat sources round(repeat x size) (or, cut below
    those, their share of `total`), weighted ones the floor or ceil of their weight's share of the
    rest, none above its count in the requested epoch; they add up to `total`."""
    assert sum(counts) == total
    full = mixture.counts.tolist()
    assert all(c <= f for c, f in zip(counts, full))  # cursors epoch x count never overlap
    fixed = {i: round(Fraction(s.repeat) * s.num_samples) for i, s in enumerate(mixture.sources)
             if s.repeat is not None and s.num_samples}
    for i in fixed:
        assert abs(full[i] - Fraction(mixture.sources[i].repeat) * mixture.sources[i].num_samples) <= Fraction(1, 2)
    weighted = [i for i, s in enumerate(mixture.sources) if s.repeat is None and s.num_samples and s.weight]
    if sum(fixed.values()) > total:  # the repeat sources alone exceed the epoch: theirs is all of it
        assert all(counts[i] == 0 for i in weighted)
        weighted, fixed = list(fixed), {}
        shares = {i: Fraction(full[i]) for i in weighted}
    else:
        assert all(counts[i] == c for i, c in fixed.items())
        shares = {i: Fraction(mixture.sources[i].weight) for i in weighted}
    free = total - sum(fixed.values())
    whole = sum(shares.values())
    for i, s in enumerate(mixture.sources):
        if i in weighted:
            quota = free * shares[i] / whole
            assert quota - 1 < counts[i] < quota + 1  # largest remainder: floor or ceil of the quota
        elif i not in fixed:
            assert counts[i] == 0  # empty or weight 0


@SETTINGS
@given(mixture=mixtures(), global_batch=st.one_of(st.just(1), st.integers(2, 70), st.sampled_from([64 * 8, 1000])))
def test_counts_add_up_by_largest_remainder(mixture, global_batch):
    assert_largest_remainder(mixture, mixture.counts.tolist(), mixture.total)
    epoch = mixture.epoch(global_batch)  # the epoch first rounded down to a multiple of the global batch
    assert epoch.total == mixture.total // global_batch * global_batch
    assert_largest_remainder(mixture, epoch.counts.tolist(), epoch.total)
    # Each position's (source, k) is distinct and k runs over 0..count-1 per source.
    per_source = Counter(s for s, _ in epoch_keys(epoch, epoch.total))
    assert all(per_source[i] == c for i, c in enumerate(epoch.counts.tolist()))


def assert_smooth(order: MixEpoch | Interleave, counts: np.ndarray) -> float:
    """Brute force over every prefix: within order.max_deviation of the shares, draws in order,
    prefix_counts right; returns the largest deviation seen."""
    total = int(counts.sum())
    cum = prefix_table(order, counts)  # also checks each source's draws are in order
    share = counts / max(total, 1)
    deviation = np.abs(cum - np.arange(total + 1)[:, None] * share[None, :]).max(initial=0.0)
    assert deviation <= order.max_deviation + 1e-9
    assert order.max_deviation < 1  # within 1 of the share over every prefix, any number of sources
    for length in {0, min(1, total), total // 3, total}:
        assert order.prefix_counts(length).tolist() == cum[length].tolist()
    return float(deviation)


@SETTINGS
@given(mixture=mixtures(max_sources=7), global_batch=st.one_of(st.just(1), st.integers(2, 40)))
def test_interleaving_is_smooth(mixture, global_batch):
    epoch = mixture.epoch(global_batch)
    assert_smooth(epoch, epoch.counts)


skewed_counts = st.lists(st.one_of(st.integers(0, 3), st.integers(1, 60), st.integers(100, 3000)), min_size=1, max_size=24)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=skewed_counts)
def test_interleaving_stays_within_its_reported_bound_for_any_number_of_sources(counts):
    counts = np.array(counts, dtype=np.int64)
    order = Interleave(counts)
    assert_smooth(order, counts)  # below 1: the tree where its bound is, else the deadline order


@pytest.mark.parametrize("counts, bound", [
    ([10000, 1000, 100, 10, 1], 0.996),  # Huffman's tree: 1.004
    ([10000, 1000, 100, 10, 1, 1, 1], 0.96),  # Huffman's: 0.987
    ([100000, 1, 2, 3, 5, 8, 13, 21], 0.9999),  # Huffman's: 1.194
    ([7, 1, 1, 1, 1, 1, 1], 0.889),  # Huffman's: 0.958
    ([1] * 20, 0.98),  # balanced
])
def test_skewed_sources_get_a_tree_within_1(counts, bound):
    order = Interleave(np.array(counts))
    assert order.max_deviation < bound


@SETTINGS
@given(mixture=mixtures(), config=configs(), world_size=world_sizes, num_workers=st.integers(1, 8),
       epoch=st.integers(0, 5))
def test_epoch_delivers_each_source_its_count_once(mixture, config, world_size, num_workers, epoch):
    state = MixState.start(mixture, epoch)
    per_rank = mix_epoch(mixture, config, world_size=world_size, num_workers=num_workers, state=state)
    assert len({len(b) for b in per_rank}) == 1  # equal steps: DDP cannot hang on data
    batches = [b for rank in per_rank for b in rank]
    delivered = [key for b in batches for key in real_keys(b)]
    assert_complete(mixture, config, delivered, world_size, world_size)
    # Each source delivers exactly its count of the epoch as delivered (dropping: rounded down to a
    # multiple of the global batch first), and those counts are its largest-remainder share.
    epoch_as_delivered = as_delivered(mixture, config, world_size)
    assert Counter(s for s, _ in delivered) == Counter(
        {s: c for s, c in enumerate(epoch_as_delivered.counts.tolist()) if c})
    assert_largest_remainder(mixture, epoch_as_delivered.counts.tolist(), epoch_as_delivered.total)
    # Within one pass over a source, no sample comes twice.
    ids_in_pass = Counter()
    for b in batches:
        for (s, k, sample_id), pad in zip(*b):
            if not pad:
                size = mixture.sources[s].num_samples
                ids_in_pass[s, (epoch * int(mixture.counts[s]) + k) // size, sample_id] += 1
    assert max(ids_in_pass.values(), default=1) == 1


@SETTINGS
@given(mixture=mixtures(), config=configs(), world_size=st.integers(1, 5), num_workers=st.integers(1, 4))
def test_mixture_plan_is_deterministic(mixture, config, world_size, num_workers):
    state = MixState.start(mixture, 3)
    first = mix_epoch(mixture, config, world_size=world_size, num_workers=num_workers, state=state)
    rebuilt = Mixture(sources=mixture.sources, epoch_samples=mixture.total)
    assert mix_epoch(rebuilt, config, world_size=world_size, num_workers=num_workers,
                     state=MixState.start(rebuilt, 3)) == first


@SETTINGS
@given(mixture=mixtures(), config=configs(), first=topologies, second=topologies, data=st.data())
def test_resume_on_any_topology_delivers_exactly_the_rest(mixture, config, first, second, data):
    state = MixState.start(mixture, data.draw(st.integers(0, 3), label="epoch"))
    steps = mix_num_steps(mixture, config=config, world_size=first[0], state=state)
    stop = data.draw(st.integers(0, steps), label="stop")
    delivered, _ = check_resume(deliver(mixture, config), advance, real_keys, state, [(first, stop), (second, None)])
    # The epoch is rounded at the world size it starts on (the second when nothing came before the
    # stop); a resume at the same world size loses nothing, at another less than one global batch.
    assert_complete(mixture, config, delivered, second[0], first[0] if stop else second[0])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(), first=topologies, second=topologies, data=st.data())
def test_resume_on_any_topology_with_the_deadline_order(config, first, second, data):
    sizes = [41, 9, 231, 8, 22, 2, 16, 4, 6, 178, 6]  # no tree of these is within 1 (best: 1.02)
    mixture = Mixture(sources=tuple(MixSource(name=f"s{i}", shard_sizes=[n // 2, n - n // 2], weight=float(n),
                                              fingerprint=f"fp{i}") for i, n in enumerate(sizes)))
    assert mixture.epoch().order.scheme == "deadlines" and mixture.max_deviation < 1
    state = MixState.start(mixture, data.draw(st.integers(0, 3), label="epoch"))
    steps = mix_num_steps(mixture, config=config, world_size=first[0], state=state)
    stop = data.draw(st.integers(0, steps), label="stop")
    delivered, _ = check_resume(deliver(mixture, config), advance, real_keys, state, [(first, stop), (second, None)])
    assert_complete(mixture, config, delivered, second[0], first[0] if stop else second[0])


@SETTINGS
@given(mixture=mixtures(), config=configs(), topology=topologies, data=st.data())
def test_resume_at_the_same_topology_replays_the_uninterrupted_run(mixture, config, topology, data):
    state = MixState.start(mixture, 1)
    steps = mix_num_steps(mixture, config=config, world_size=topology[0], state=state)
    batches = data.draw(st.integers(0, steps), label="batches")
    check_same_topology_resume(deliver(mixture, config), advance, state, topology, batches)


def test_three_sources_blend_exactly_by_weight():
    mixture = Mixture(sources=(MixSource(name="web", shard_sizes=[400] * 5, weight=0.7),
                               MixSource(name="curated", shard_sizes=[97, 203], weight=0.2),
                               MixSource(name="gold", shard_sizes=[30], weight=0.1)))
    assert mixture.total == 2330 and mixture.counts.tolist() == [1631, 466, 233]  # gold: 233 of 30: upsampled
    config = PlanConfig(seed=7, batch_size=5, shuffle_window=64, tail="pad")
    per_rank = mix_epoch(mixture, config, world_size=3, num_workers=2, state=MixState.start(mixture, 0))
    delivered = [key for rank in per_rank for b in rank for key in real_keys(b)]
    assert Counter(s for s, _ in delivered) == {0: 1631, 1: 466, 2: 233}
    # Every batch-sized stretch of the epoch is close to the requested blend.
    source, _ = mixture.locate(np.arange(mixture.total))
    for start in range(0, mixture.total - 100, 100):
        assert abs(np.count_nonzero(source[start:start + 100] == 0) - 70) <= 2


def test_downsampled_source_goes_on_where_it_stopped_next_epoch():
    big = MixSource(name="big", shard_sizes=[50, 50, 20], weight=1.0)  # 120 samples, 30 per epoch
    mixture = Mixture(sources=(big, MixSource(name="small", shard_sizes=[30], weight=1.0)), epoch_samples=60)
    config = PlanConfig(seed=3, batch_size=2, shuffle_window=8, tail="pad")
    seen = []
    for epoch in range(4):  # four epochs of 30 draws: exactly one pass over the 120 samples
        per_rank = mix_epoch(mixture, config, world_size=2, num_workers=1, state=MixState.start(mixture, epoch))
        seen += [i for rank in per_rank for b in rank for (s, _, i), pad in zip(*b) if s == 0 and not pad]
    assert sorted(seen) == list(range(120))
    # Upsampled: the small source's 30 draws a pass, per epoch, in a new order each pass.
    small = [mixture.draw_ids(1, np.arange(30), config=config, epoch=e).tolist() for e in range(2)]
    assert sorted(small[0]) == sorted(small[1]) == list(range(120, 150))


@pytest.mark.parametrize("change, message", [
    ({"weights": (0.5, 0.5)}, r"source 0 \(a\) had weight 0.7 when saved, this mixture has 0.5"),
    ({"names": ("a", "c")}, r"source 1 was 'b' .* now 'c'"),
    ({"extra": True}, r"saved with sources \['a', 'b'\], this mixture has \['a', 'b', 'x'\]"),
    ({"epoch_samples": 50}, "epoch had 40 samples when saved, this one has 50"),
    ({"sizes_b": [5, 6]}, r"source 1 \(b\) had num_samples 10 when saved, this mixture has 11"),
])
def test_state_from_another_mixture_is_refused_naming_the_difference(change, message):
    def make(weights=(0.7, 0.3), names=("a", "b"), extra=False, epoch_samples=40, sizes_b=(5, 5)):
        sources = [MixSource(name=names[0], shard_sizes=[20, 10], weight=weights[0], fingerprint=names[0]),
                   MixSource(name=names[1], shard_sizes=list(sizes_b), weight=weights[1], fingerprint=names[1])]
        if extra:
            sources.append(MixSource(name="x", shard_sizes=[3], weight=1.0, fingerprint="x"))
        return Mixture(sources=tuple(sources), epoch_samples=epoch_samples)

    saved = advance(MixState.start(make(), 0), (2, 1), 3)
    config = PlanConfig(seed=0, batch_size=2)
    other = make(**change)
    with pytest.raises(StateError, match=message):
        mix_num_steps(other, config=config, world_size=2, state=saved)
    with pytest.raises(StateError, match=message):
        plan_mix_worker(other, config=config, slot=WorkerSlot(rank=0, world_size=1, worker_id=0, num_workers=1),
                        state=saved)
    assert mix_num_steps(make(), config=config, world_size=2, state=saved) == 10 - 3


def test_bad_mixtures_are_refused():
    with pytest.raises(ValueError, match="a weight or a repeat, not both"):
        MixSource(name="a", shard_sizes=[3], weight=1.0, repeat=2.0)
    with pytest.raises(ValueError, match="weight must be >= 0"):
        MixSource(name="a", shard_sizes=[3], weight=-1.0)
    with pytest.raises(TypeError, match="finite"):
        MixSource(name="a", shard_sizes=[3], weight=float("nan"))
    with pytest.raises(ValueError, match="smaller than the repeat sources"):
        Mixture(sources=(MixSource(name="a", shard_sizes=[3], repeat=2.0),), epoch_samples=5)
    with pytest.raises(ValueError, match="none has samples and a weight"):
        Mixture(sources=(MixSource(name="a", shard_sizes=[0], weight=1.0),), epoch_samples=5)
    with pytest.raises(TypeError, match="non-empty sequence of MixSource"):
        Mixture(sources=())
    with pytest.raises(StateError, match="malformed mixture state"):
        MixState.from_dict({"plan": {}})


def test_state_of_an_older_interleaving_is_refused():
    mixture = Mixture(sources=(MixSource(name="a", shard_sizes=[20], weight=1.0, fingerprint="a"),
                               MixSource(name="b", shard_sizes=[7], weight=1.0, fingerprint="b")))
    saved = advance(MixState.start(mixture, 0), (2, 1), 1)
    old = MixState(plan=saved.plan, mixture={**saved.mixture, "mix_version": 1})
    with pytest.raises(StateError, match=f"saved by mix version 1, this shardify uses {MIX_VERSION}"):
        mix_num_steps(mixture, config=PlanConfig(seed=0, batch_size=2), world_size=2, state=old)


def test_sources_of_maps_global_ids_to_source_shard_and_position():
    mixture = Mixture(sources=(MixSource(name="a", shard_sizes=[3, 0, 2], weight=1.0),
                               MixSource(name="empty", shard_sizes=[], weight=0.0),
                               MixSource(name="b", shard_sizes=[0, 4], weight=1.0)))
    expected = [(0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 2, 0), (0, 2, 1), (2, 1, 0), (2, 1, 1), (2, 1, 2), (2, 1, 3)]
    source, shard, position = mixture.sources_of(np.arange(9))
    assert list(zip(source.tolist(), shard.tolist(), position.tolist())) == expected


def test_many_sources_get_a_locally_improved_tree():
    counts = [3000, 2500, 1200, 900, 700, 400, 300, 120, 90, 60, 30, 12]  # past the exhaustive search
    order = Interleave(np.array(counts))
    assert order.max_deviation < 1.05  # Huffman's tree: 1.18
    assert_smooth(order, np.array(counts))


def test_an_epoch_is_rounded_to_a_positive_global_batch():
    mixture = Mixture(sources=(MixSource(name="a", shard_sizes=[20], weight=1.0),))
    assert mixture.epoch(6).total == 18 and mixture.epoch(6).counts.tolist() == [18]
    with pytest.raises(ValueError, match="global_batch must be an int >= 1"):
        mixture.epoch(0)


@SETTINGS
@given(sizes=sizes_of_shards, config=configs(), first=topologies,
       second=st.tuples(st.integers(1, 4), st.integers(1, 3)), data=st.data())
def test_mixture_of_one_is_the_single_dataset_plan(sizes, config, first, second, data):
    """One source, no repeat, its own size as the epoch: plan_worker's windows and steps, bit for bit,
    from any resume state (the mixture's key and rounding are for real mixtures)."""
    mixture = Mixture(sources=(MixSource(name="one", shard_sizes=sizes, fingerprint="fp"),))
    assert mixture.single
    plan = PlanState(epoch=data.draw(st.integers(0, 3), label="epoch"))
    done = data.draw(st.integers(0, num_steps(sizes, config=config, world_size=first[0], state=plan)), label="done")
    if done:
        plan = plan.advanced(world_size=first[0], num_workers=first[1], batches=done)
    state = MixState(plan=plan, mixture=mixture.describe())
    world_size, num_workers = second
    assert mix_num_steps(mixture, config=config, world_size=world_size, state=state) == num_steps(
        sizes, config=config, world_size=world_size, state=plan)
    for rank in range(world_size):
        for worker_id in range(num_workers):
            slot = WorkerSlot(rank=rank, world_size=world_size, worker_id=worker_id, num_workers=num_workers)
            mixed, single = plan_mix_worker(mixture, config=config, slot=slot, state=state), plan_worker(
                sizes, config=config, slot=slot, state=plan)
            assert np.array_equal(mixed.batch_numbers, single.batch_numbers)
            assert [(w.segments, w.sample_ids.tolist(), w.is_pad.tolist()) for w in mixed.windows] == [
                (w.segments, w.sample_ids.tolist(), w.is_pad.tolist()) for w in single.windows]


def test_a_repeated_or_resized_single_source_is_a_real_mixture():
    sizes = [5, 3]
    assert not Mixture(sources=(MixSource(name="a", shard_sizes=sizes, repeat=2.0),)).single
    assert not Mixture(sources=(MixSource(name="a", shard_sizes=sizes),), epoch_samples=4).single
    assert Mixture(sources=(MixSource(name="a", shard_sizes=sizes, weight=3.0),), epoch_samples=8).single
