"""The token plan (dataio/plan/token_plan.py), every rank and worker in one process: the five plan
properties in tokens, for concat and aligned packing, hypothesis varying document lengths, topologies
and stop points."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dataio.plan.token_mix import plan_token_mix_worker, token_mix_num_steps, token_mixture
from dataio.plan.token_plan import SequenceOrder, TokenPlanConfig, plan_token_worker, token_num_steps
from dataio.plan.types import PlanConfig, PlanState, WorkerSlot
from tests.dataio.resume_harness import Topology, check_resume, check_same_topology_resume

# Documents per shard lean on corner cases: empty shards, one-token documents (an EOS alone), long ones.
doc_length = st.one_of(st.just(1), st.integers(1, 12), st.integers(13, 90))
shard_docs = st.lists(st.lists(doc_length, min_size=0, max_size=8), min_size=0, max_size=8)
world_sizes = st.one_of(st.integers(1, 4), st.sampled_from([7, 16]))
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Seq = tuple[int, int, int, bool]  # (stream start, tokens read, tokens owned, is_pad)
Batch = tuple[Seq, ...]


@st.composite
def configs(draw: st.DrawFn) -> TokenPlanConfig:
    plan = PlanConfig(seed=draw(st.integers(0, 2**64 - 1)), batch_size=draw(st.integers(1, 6)),
                      tail=draw(st.sampled_from(["drop", "pad"])), shuffle=draw(st.booleans()),
                      shuffle_window=draw(st.one_of(st.just(1), st.integers(2, 20), st.just(4096))))
    return TokenPlanConfig(seq_len=draw(st.integers(1, 24)), packing=draw(st.sampled_from(["concat", "aligned"])),
                           plan=plan)


def _order(docs: Sequence[Sequence[int]], config: TokenPlanConfig, epoch: int) -> SequenceOrder | None:
    try:
        return SequenceOrder(docs, config, epoch)
    except ValueError:  # aligned packing with seq_len above every document: refused (its own test)
        return None


def epoch_batches(docs: Sequence[Sequence[int]], config: TokenPlanConfig, state: PlanState,
                  topology: Topology) -> list[list[Batch]]:
    """Per rank, its batches from the state on; each worker's reads checked against its sequences."""
    world_size, num_workers = topology
    steps = token_num_steps(docs, config=config, world_size=world_size, state=state)
    per_rank = []
    for rank in range(world_size):
        by_number: dict[int, Batch] = {}
        for worker_id in range(num_workers):
            slot = WorkerSlot(rank=rank, world_size=world_size, worker_id=worker_id, num_workers=num_workers)
            plan = plan_token_worker(docs, config=config, slot=slot, state=state)
            assert plan.num_steps == steps  # equal steps: DDP cannot hang on data
            seqs = [s for w in plan.windows for s in _window_seqs(w, plan.order)]
            B = config.plan.batch_size
            assert len(seqs) == len(plan.batch_numbers) * B
            by_number.update({int(j): tuple(seqs[i * B:(i + 1) * B]) for i, j in enumerate(plan.batch_numbers)})
        assert sorted(by_number) == list(range(steps))
        per_rank.append([by_number[j] for j in range(steps)])
    return per_rank


def _window_seqs(window, order: SequenceOrder) -> list[Seq]:
    """The window's sequences; asserts its segments read each shard front to back and cover them."""
    covered: set[int] = set()
    last_stop: dict[int, int] = {}
    for seg in window.segments:
        assert 0 <= seg.start < seg.stop and seg.start >= last_stop.get(seg.shard, 0), seg
        last_stop[seg.shard] = seg.stop
        covered.update(range(order.shards.offsets[seg.shard] + seg.start, order.shards.offsets[seg.shard] + seg.stop))
    out = []
    for start, n, owned, pad in zip(window.stream_starts.tolist(), window.num_tokens.tolist(),
                                    window.num_owned.tolist(), window.is_pad.tolist()):
        assert 1 <= owned <= n <= order.seq_len + 1
        assert set(order.token_ids(start, n).tolist()) <= covered  # every token it needs is read
        out.append((start, n, owned, pad))
    return out


def owned_ids(order: SequenceOrder):
    def real_keys(batch: Batch) -> list[int]:
        return [t for start, _, owned, pad in batch if not pad for t in order.token_ids(start, owned).tolist()]
    return real_keys


def advance(state: PlanState, topology: Topology, batches: int) -> PlanState:
    nxt = state.advanced(world_size=topology[0], num_workers=topology[1], batches=batches)
    return PlanState.from_dict(nxt.to_dict())


@SETTINGS
@given(docs=shard_docs, config=configs(), world_size=world_sizes, num_workers=st.integers(1, 4))
def test_every_token_once_but_a_tail_and_equal_steps(docs, config, world_size, num_workers):
    order = _order(docs, config, 0)
    assume(order is not None)
    state = PlanState(epoch=0)
    per_rank = epoch_batches(docs, config, state, (world_size, num_workers))
    seen = [t for batches in per_rank for b in batches for t in owned_ids(order)(b)]
    assert len(seen) == len(set(seen))  # nothing twice
    total = order.num_tokens
    global_batch = world_size * config.plan.batch_size
    if config.plan.tail == "pad":
        assert sorted(seen) == list(range(total))  # every token, repeats flagged
    else:  # only a tail under one global batch of sequences is left out
        assert total - len(seen) <= (global_batch - 1) * (config.seq_len + 1)
        assert order.num_sequences - len(per_rank[0]) * global_batch < global_batch


@SETTINGS
@given(docs=shard_docs, config=configs(), world_size=st.integers(1, 3), num_workers=st.integers(1, 3))
def test_sequences_follow_the_packing(docs, config, world_size, num_workers):
    order = _order(docs, config, 0)
    assume(order is not None)
    L = config.seq_len
    shard_order = order.shards.order.tolist()
    lengths = [n for s in shard_order for n in docs[s]]
    doc_starts = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    for batches in epoch_batches(docs, config, PlanState(epoch=0), (world_size, num_workers)):
        for start, n, owned, _ in (s for b in batches for s in b):
            if config.packing == "concat":
                assert start % L == 0 and n == min(L + 1, order.num_tokens - start)
            else:  # starts at a document start or a split of a long one; never crosses into the next
                d = int(np.searchsorted(doc_starts, start, side="right") - 1)
                assert (start - doc_starts[d]) % L == 0 and start + n <= doc_starts[d + 1]


@SETTINGS
@given(docs=shard_docs, config=configs(), world_size=st.integers(1, 3), num_workers=st.integers(1, 3))
def test_reads_are_contiguous_and_close_to_the_size(docs, config, world_size, num_workers):
    order = _order(docs, config, 0)
    assume(order is not None)
    read = windows = 0
    for rank in range(world_size):
        for worker_id in range(num_workers):
            slot = WorkerSlot(rank=rank, world_size=world_size, worker_id=worker_id, num_workers=num_workers)
            plan = plan_token_worker(docs, config=config, slot=slot, state=PlanState(epoch=0))
            windows += len(plan.windows)
            read += sum(s.stop - s.start for w in plan.windows for s in w.segments)
    # a fresh epoch reads each token once, plus at most one lookahead token per window, plus the
    # windows padded with repeats of their own sequences (tail="pad")
    extra = (world_size * config.plan.batch_size) * (config.seq_len + 1) if config.plan.tail == "pad" else 0
    assert read <= order.num_tokens + windows + extra


@SETTINGS
@given(docs=shard_docs, config=configs())
def test_deterministic_and_new_epoch_new_order(docs, config):
    order = _order(docs, config, 0)
    assume(order is not None)
    first = epoch_batches(docs, config, PlanState(epoch=0), (2, 2))
    assert first == epoch_batches(docs, config, PlanState(epoch=0), (2, 2))
    keys = owned_ids(order)
    epoch1 = epoch_batches(docs, config, PlanState(epoch=1), (2, 2))
    order1 = _order(docs, config, 1)
    a = [keys(b) for r in first for b in r]
    b = [owned_ids(order1)(x) for r in epoch1 for x in r]
    # A new order is all but certain only with something to shuffle: sequences within windows
    # (window > 1), or enough non-empty shards that two permutations agree by chance < 1/40,000.
    nonempty = sum(1 for shard in docs if sum(shard) > 0)
    if config.plan.shuffle and order.num_sequences >= 64 and (config.plan.shuffle_window > 1 or nonempty >= 8):
        assert a != b


@SETTINGS
@given(docs=shard_docs, config=configs(), data=st.data())
def test_resume_at_any_topology_delivers_exactly_the_rest(docs, config, data):
    order = _order(docs, config, 0)
    assume(order is not None)
    topologies = st.tuples(st.integers(1, 4), st.integers(1, 3))
    stages = data.draw(st.lists(topologies, min_size=1, max_size=3))

    def deliver(state, topology):
        return epoch_batches(docs, config, state, topology)

    state, schedule = PlanState(epoch=0), []
    for topology in stages:
        steps = token_num_steps(docs, config=config, world_size=topology[0],
                                state=_after(state, schedule))
        take = data.draw(st.integers(0, steps))
        schedule.append((topology, take))
    final = data.draw(topologies)
    delivered, end = check_resume(deliver, advance, owned_ids(order), state, [*schedule, (final, None)])
    if config.plan.tail == "pad":
        assert sorted(delivered) == list(range(order.num_tokens))
    else:
        assert order.num_tokens - len(delivered) <= (final[0] * config.plan.batch_size - 1) * (config.seq_len + 1)
    check_same_topology_resume(deliver, advance, state, stages[0], schedule[0][1])


def _after(state: PlanState, schedule: list[tuple[Topology, int]]) -> PlanState:
    for topology, take in schedule:
        state = advance(state, topology, take)
    return state


@SETTINGS
@given(docs=shard_docs, config=configs(), first=st.tuples(st.integers(1, 4), st.integers(1, 3)),
       second=st.tuples(st.integers(1, 4), st.integers(1, 3)), data=st.data())
def test_token_mixture_of_one_is_the_single_dataset_plan(docs, config, first, second, data):
    """One token dataset as a mixture of one (what the loader builds): plan_token_worker's windows, groups
    and steps, bit for bit, from any resume state (the mixture's seed and rounding are for real mixtures)."""
    assume(_order(docs, config, 0) is not None)
    mixture = token_mixture([docs], config, names=["one"], weights=[1.0], fingerprints=["fp"])
    assert mixture.single
    state = PlanState(epoch=data.draw(st.integers(0, 3), label="epoch"))
    done = data.draw(st.integers(0, token_num_steps(docs, config=config, world_size=first[0], state=state)))
    state = state.advanced(world_size=first[0], num_workers=first[1], batches=done) if done else state
    world_size, num_workers = second
    assert token_mix_num_steps([docs], mixture, config=config, world_size=world_size, state=state) == \
        token_num_steps(docs, config=config, world_size=world_size, state=state)
    for rank in range(world_size):
        for worker_id in range(num_workers):
            slot = WorkerSlot(rank=rank, world_size=world_size, worker_id=worker_id, num_workers=num_workers)
            mixed = plan_token_mix_worker([docs], mixture, config=config, slot=slot, state=state)
            single = plan_token_worker(docs, config=config, slot=slot, state=state)
            assert np.array_equal(mixed.batch_numbers, single.batch_numbers)
            assert [_window_facts(w) for w in mixed.windows] == [_window_facts(w) for w in single.windows]


def _window_facts(window) -> tuple:
    groups = [(g.source, g.first, g.end, g.order.shards.order.tolist()) for g in window.groups]
    return (type(window).__name__, window.segments, window.stream_starts.tolist(), window.num_tokens.tolist(),
            window.num_owned.tolist(), window.is_pad.tolist(), window.group.tolist(), groups)


def test_aligned_refuses_seq_len_above_every_document():
    config = TokenPlanConfig(seq_len=64, packing="aligned", plan=PlanConfig(seed=0, batch_size=2))
    with pytest.raises(ValueError, match="larger than every document"):
        SequenceOrder([[5, 9], [30]], config, 0)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="seq_len"):
        TokenPlanConfig(seq_len=0, plan=PlanConfig(seed=0, batch_size=1))
    with pytest.raises(ValueError, match="packing"):
        TokenPlanConfig(seq_len=4, packing="best", plan=PlanConfig(seed=0, batch_size=1))
    with pytest.raises(ValueError, match="at least one token"):
        SequenceOrder([[3, 0]], TokenPlanConfig(seq_len=4, plan=PlanConfig(seed=0, batch_size=1)), 0)
