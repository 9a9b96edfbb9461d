"""Scheduled mixtures (plan/schedule.py): exact per-piece counts, pieces in time order on every rank,
no repeat within a source pass across segments, and a resume mid-piece at another topology that
delivers what the uninterrupted run delivers."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataio.errors import StateError
from dataio.plan.mix import MixSource, MixState, MixWindow, mix_num_steps, plan_mix_worker
from dataio.plan.schedule import Piece, Schedule, linear_ramp, parse_schedule, scheduled
from dataio.plan.types import PlanConfig, PlanState, WorkerSlot

B = 2
SOURCES = (MixSource(name="a", shard_sizes=[30, 18, 24]), MixSource(name="b", shard_sizes=[20, 16]),
           MixSource(name="c", shard_sizes=[9, 15]))
# 132 samples per epoch; pieces of 72 then 132 then the rest: boundaries inside epochs 0 and 1
PIECES = (Piece(weights=(0.7, 0.2, 0.1), samples=72), Piece(weights=(0.5, 0.3, 0.2), samples=132),
          Piece(weights=(0.2, 0.2, 0.6)))
CONFIG = PlanConfig(seed=7, batch_size=B, shuffle_window=8)


def _steps(mixture, state: PlanState, world_size: int, num_workers: int) -> list[list[list[tuple[int, int]]]]:
    """[step][rank] -> (source, id) of every sample, from the state on, checked per worker plan."""
    mstate = MixState(plan=state, mixture=mixture.describe())
    steps = mix_num_steps(mixture, config=CONFIG, world_size=world_size, state=mstate)
    per_rank = []
    for rank in range(world_size):
        batches: dict[int, list[tuple[int, int]]] = {}
        for w in range(num_workers):
            slot = WorkerSlot(rank=rank, world_size=world_size, worker_id=w, num_workers=num_workers)
            plan = plan_mix_worker(mixture, config=CONFIG, slot=slot, state=mstate)
            assert plan.num_steps == steps
            keys = [(int(s), int(i)) for win in plan.windows for s, i in zip(win.source, win.sample_ids)
                    if isinstance(win, MixWindow)]
            for n, j in enumerate(plan.batch_numbers.tolist()):
                batches[j] = keys[n * B:(n + 1) * B]
        assert sorted(batches) == list(range(steps))
        per_rank.append([batches[j] for j in range(steps)])
    return [[per_rank[r][j] for r in range(world_size)] for j in range(steps)]


def _flat(steps) -> list[tuple[int, int]]:
    return [k for step in steps for rank in step for k in rank]


def test_pieces_deliver_exact_counts_in_time_order_and_continue_source_passes():
    mixture = scheduled(SOURCES, PIECES)
    world_size, delivered = 2, []
    for epoch in range(3):
        delivered += _flat(_steps(mixture, PlanState(epoch=epoch), world_size, 2))
    # Segments: epoch 0 = 72 (piece 0) + 60 (piece 1); epoch 1 = 72 (piece 1) + 60 (piece 2); epoch 2 = 132.
    bounds = [0, 72, 132, 204, 264, 396]
    pieces = [0, 1, 1, 2, 2]
    for (lo, hi), p in zip(zip(bounds, bounds[1:]), pieces):
        got = Counter(s for s, _ in delivered[lo:hi])
        quota = np.array(PIECES[p].weights) / sum(PIECES[p].weights) * (hi - lo)
        assert all(abs(got[s] - quota[s]) < 1 for s in range(3)), (lo, hi, got, quota)
    base = np.cumsum([0] + [src.num_samples for src in SOURCES])
    for s in range(len(SOURCES)):  # draws continue across segments: each pass whole before the next
        seen = Counter(i for t, i in delivered if t == s)
        times = [seen.get(i, 0) for i in range(base[s], base[s + 1])]
        assert max(times) - min(times) <= 1, (s, Counter(times))


@settings(max_examples=25, deadline=None)
@given(cut=st.integers(1, 32), first=st.sampled_from([(2, 1), (2, 3)]),
       second=st.sampled_from([(3, 1), (3, 2), (1, 4)]), epoch=st.integers(0, 1))
def test_resume_mid_piece_at_another_topology_delivers_the_same_multiset(cut, first, second, epoch):
    # Segment lengths are multiples of 12 (world sizes 1, 2, 3: global batch 2, 4, 6), so only the
    # segment cut by the resume may drop a new tail, under one global batch of the new topology.
    mixture = scheduled(SOURCES, (Piece(weights=(0.7, 0.2, 0.1), samples=96), Piece(weights=(0.5, 0.3, 0.2))))
    whole = _flat(_steps(mixture, PlanState(epoch=epoch), *first))
    head = _steps(mixture, PlanState(epoch=epoch), *first)[:cut]
    state = PlanState(epoch=epoch).advanced(world_size=first[0], num_workers=first[1], batches=cut)
    state = PlanState.from_dict(state.to_dict())
    rest = _steps(mixture, state, *second)
    got, want = Counter(_flat(head) + _flat(rest)), Counter(whole)
    assert not got - want  # nothing twice, nothing the uninterrupted run does not deliver
    left, done = 0, cut * first[0] * B  # what the segment the resume cuts has left
    for length in ([96, 36] if epoch == 0 else [132]):
        left, done = (length - done if 0 <= done < length else left), done - length
    assert sum((want - got).values()) == left % (second[0] * B)  # its new tail, under one global batch


def test_a_piece_that_ran_cannot_change_on_resume_a_later_one_can():
    mixture = scheduled(SOURCES, PIECES)
    saved = mixture.describe()
    later = scheduled(SOURCES, PIECES[:2] + (Piece(weights=(0.1, 0.1, 0.8)),))
    assert later.check_schedule(saved, PlanState(epoch=0), CONFIG) == [
        "schedule piece 2 from run position 204: [0.2, 0.2, 0.6] until inf -> [0.1, 0.1, 0.8] until inf"]
    # Epoch 1 is two segments, 132..204 (piece 1) and 204..264 (piece 2): until the first is over,
    # the second is not planned and may change; from then on it may not.
    assert later.check_schedule(saved, PlanState(epoch=1).advanced(world_size=1, num_workers=1, batches=35),
                                CONFIG)
    in_piece_2 = PlanState(epoch=1).advanced(world_size=1, num_workers=1, batches=37)
    with pytest.raises(StateError, match="schedule piece 2 gave run positions 204..264"):
        later.check_schedule(saved, in_piece_2, CONFIG)
    moved = scheduled(SOURCES, (PIECES[0], Piece(weights=(0.5, 0.3, 0.2), samples=150), PIECES[2]))
    with pytest.raises(StateError, match="segment in progress ends at run position 204"):
        moved.check_schedule(saved, PlanState(epoch=1), CONFIG)


def test_a_source_added_on_resume_joins_where_a_later_piece_weighs_it():
    saved = scheduled(SOURCES[:2], tuple(Piece(p.weights[:2], p.samples) for p in PIECES), 132).describe()
    added = scheduled(SOURCES, (Piece((0.7, 0.2, 0.0), 72), Piece((0.5, 0.3, 0.2))), 132)
    assert added.check_schedule(saved, PlanState(epoch=0), CONFIG) == [
        "schedule piece 1 from run position 72: [0.5, 0.3, 0.0] until 204 -> [0.5, 0.3, 0.2] until inf",
        "the schedule now has 2 pieces (was 3)",
        "source 2 (c) added: it joins at run position 72 with weight 0.2 (epoch 0)"]
    with pytest.raises(StateError, match=r"piece 1 gave run positions 72..132 the weights \[0.5, 0.3, 0.0\]"):
        added.check_schedule(saved, PlanState(epoch=0).advanced(world_size=1, num_workers=1, batches=37), CONFIG)
    past = scheduled(SOURCES, (Piece((0.7, 0.2, 0.1), 72), Piece((0.5, 0.3, 0.2))), 132)
    with pytest.raises(StateError, match=r"piece 0 gave run positions 0..72 the weights \[0.7, 0.2, 0.0\]"):
        past.check_schedule(saved, PlanState(epoch=0), CONFIG)


def test_schedule_text_and_ramps():
    assert parse_schedule("0.7,0.3@100; 0.5,0.5") == (Piece((0.7, 0.3), 100), Piece((0.5, 0.5)))
    ramp = parse_schedule("1,0~0,1@100/4; 0,1")
    assert [p.samples for p in ramp] == [25, 25, 25, 25, None] and ramp[0].weights == (0.875, 0.125)
    assert linear_ramp((1, 0), (0, 1), samples=10, num_pieces=3)[1].weights == (0.5, 0.5)
    with pytest.raises(ValueError, match="only the last schedule piece"):
        parse_schedule("0.5,0.5; 0.2,0.8@10")


@pytest.mark.parametrize("text", ["0.5,0.5@16", "0.7,0.3@100; 0.5,0.5@16", "1,0~0,1@100/4"])
def test_a_last_piece_with_a_length_is_refused_naming_it(text):
    # It used to be taken, and the run ended silently where the piece ended (issue 32, failure 2).
    with pytest.raises(ValueError, match=r"the last schedule piece \(.*@\d+\) has a length"):
        parse_schedule(text)
    with pytest.raises(ValueError, match="has a length"):
        Schedule((Piece((0.5, 0.5), 10), Piece((0.2, 0.8), 16)))
    assert Schedule.parse("0.5,0.5@16; 0.5,0.5").pieces[-1].samples is None
