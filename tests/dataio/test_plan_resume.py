"""The sample plan's resume property (DESIGN.md 4) and its saved state, all ranks in one process."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataio import StateError
from dataio.plan.plan import READ_THROUGH_GAP, num_steps, plan_worker
from dataio.plan.types import PLAN_VERSION, PlanConfig, PlanState, Progress, WorkerSlot
from tests.dataio.plan_harness import (
    configs,
    plan_advance,
    plan_deliver,
    plan_epoch,
    real_ids,
    segment_totals,
    shard_sizes,
)
from tests.dataio.resume_harness import check_resume, check_same_topology_resume

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
topologies = st.tuples(st.one_of(st.integers(1, 5), st.sampled_from([8, 16, 64])), st.integers(1, 8))


def assert_complete(delivered, sizes, config, final_world_size):
    """Exactly once over the whole (interrupted) epoch: the drop tail is the last stage's alone."""
    total = sum(sizes)
    assert len(delivered) == len(set(delivered))
    assert set(delivered) <= set(range(total))
    if config.tail == "pad":
        assert sorted(delivered) == list(range(total))
    else:
        assert total - len(delivered) < final_world_size * config.batch_size


def run_schedule(sizes, config, schedule, state=None):
    return check_resume(plan_deliver(sizes, config), plan_advance, real_ids, state or PlanState(epoch=0), schedule)


def test_resume_from_two_ranks_two_workers_on_three_ranks_one_worker():
    sizes = [97, 3, 0, 50, 1, 128, 0, 77]  # deliberately uneven
    for tail in ("drop", "pad"):
        config = PlanConfig(seed=42, batch_size=4, tail=tail, shuffle_window=16)
        for stop in (0, 1, 5, 13, 20):
            delivered, state = run_schedule(sizes, config, [((2, 2), stop), ((3, 1), None)])
            assert_complete(delivered, sizes, config, 3)
            assert state.progress[0] == Progress(world_size=2, num_workers=2, batches=stop) or stop == 0


def test_resume_inside_the_window_where_padding_starts():
    # Padding sits at the end of the last rank's span; a stop inside the shuffled window that
    # holds both real samples and padding must carry over exactly its undelivered real ones.
    for sizes, (world_size, num_workers), batch_size, window in [
            ([13], (1, 1), 2, 8), ([5, 0, 1, 9], (2, 1), 3, 5), ([7, 1, 0, 12], (3, 2), 2, 4)]:
        for seed in range(4):
            config = PlanConfig(seed=seed, batch_size=batch_size, tail="pad", shuffle_window=window)
            steps = num_steps(sizes, config=config, world_size=world_size, state=PlanState(epoch=0))
            for stop in range(steps + 1):
                for second in [(2, 1), (1, 3)]:
                    delivered, _ = run_schedule(sizes, config, [((world_size, num_workers), stop), (second, None)])
                    assert_complete(delivered, sizes, config, second[0])


@SETTINGS
@given(sizes=shard_sizes, config=configs(), first=topologies, second=topologies, data=st.data())
def test_resume_on_any_topology_delivers_exactly_the_rest(sizes, config, first, second, data):
    steps = num_steps(sizes, config=config, world_size=first[0], state=PlanState(epoch=0))
    stop = data.draw(st.integers(0, steps), label="stop")
    delivered, _ = run_schedule(sizes, config, [(first, stop), (second, None)])
    assert_complete(delivered, sizes, config, second[0])


@SETTINGS
@given(sizes=shard_sizes, config=configs(), path=st.lists(topologies, min_size=2, max_size=4), data=st.data())
def test_nested_resumes_deliver_exactly_the_rest(sizes, config, path, data):
    state, schedule = PlanState(epoch=data.draw(st.integers(0, 9), label="epoch")), []
    for topology in path[:-1]:
        # Each stage stops somewhere inside what is left (drawn from num_steps at that point).
        probe = state
        for (ws, nw), k in schedule:
            probe = probe.advanced(world_size=ws, num_workers=nw, batches=k)
        left = num_steps(sizes, config=config, world_size=topology[0], state=probe)
        schedule.append((topology, data.draw(st.integers(0, left), label="stop")))
    schedule.append((path[-1], None))
    delivered, _ = run_schedule(sizes, config, schedule, state)
    assert_complete(delivered, sizes, config, path[-1][0])


@SETTINGS
@given(sizes=shard_sizes, config=configs(), before=st.lists(topologies, max_size=2), topology=topologies,
       data=st.data())
def test_resume_at_the_same_topology_replays_the_uninterrupted_run(sizes, config, before, topology, data):
    state = PlanState(epoch=1)
    for ws, nw in before:  # possibly after earlier resumes elsewhere
        left = num_steps(sizes, config=config, world_size=ws, state=state)
        state = state.advanced(world_size=ws, num_workers=nw, batches=data.draw(st.integers(0, left)))
    left = num_steps(sizes, config=config, world_size=topology[0], state=state)
    batches = data.draw(st.integers(0, left), label="batches")
    check_same_topology_resume(plan_deliver(sizes, config), plan_advance, state, topology, batches)
    # Stopping twice at the same topology is the same as stopping once at the sum.
    half = batches // 2
    twice = plan_advance(plan_advance(state, topology, half), topology, batches - half)
    assert twice == plan_advance(state, topology, batches)


def test_resume_keeps_reads_local():
    sizes = [40] * 30
    config = PlanConfig(seed=1, batch_size=4, shuffle_window=64)
    state = PlanState(epoch=0).advanced(world_size=2, num_workers=2, batches=7)
    state = state.advanced(world_size=3, num_workers=3, batches=5)
    left = num_steps(sizes, config=config, world_size=4, state=state) * 4 * 4
    read, segments, windows = segment_totals(sizes, config, world_size=4, num_workers=1, state=state)
    # Each interrupted window (one per worker per stage) leaves a scattered remainder, read with
    # its short gaps at most once; everything else is read exactly, in runs.
    interrupted = 2 * 2 + 3 * 3
    assert left <= read <= left + interrupted * 64
    assert segments <= 30 + windows + interrupted * 64 // (READ_THROUGH_GAP + 1) + interrupted


def test_finished_epoch_resumes_to_nothing():
    sizes, config = [10, 7, 0, 5], PlanConfig(seed=0, batch_size=2, tail="pad")
    steps = num_steps(sizes, config=config, world_size=2, state=PlanState(epoch=0))
    state = PlanState(epoch=0).advanced(world_size=2, num_workers=3, batches=steps)
    for world_size, num_workers in [(2, 3), (5, 1)]:
        assert plan_epoch(sizes, config, world_size=world_size, num_workers=num_workers, state=state) == (
            [[] for _ in range(world_size)])


def test_state_from_another_dataset_is_refused():
    config = PlanConfig(seed=0, batch_size=2)
    state = PlanState(epoch=0).advanced(world_size=2, num_workers=1, batches=50)
    slot = WorkerSlot(rank=0, world_size=2, worker_id=0, num_workers=1)
    for other in (slot, WorkerSlot(rank=0, world_size=3, worker_id=0, num_workers=1)):
        with pytest.raises(StateError, match="50 batches were delivered"):
            plan_worker([10, 20], config=config, slot=other, state=state)
    with pytest.raises(StateError, match="start the epoch over"):
        num_steps([10, 20], config=config, world_size=3, state=state)


def test_state_round_trips_through_json():
    state = PlanState(epoch=3).advanced(world_size=2, num_workers=2, batches=4)
    state = state.advanced(world_size=2, num_workers=2, batches=3).advanced(world_size=3, num_workers=1, batches=1)
    assert state.progress == (Progress(world_size=2, num_workers=2, batches=7),
                              Progress(world_size=3, num_workers=1, batches=1))
    assert PlanState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    assert state.advanced(world_size=5, num_workers=1, batches=0) == state


@pytest.mark.parametrize("bad, message", [
    ({"plan_version": PLAN_VERSION + 1, "epoch": 0, "progress": []},
     f"saved by plan version {PLAN_VERSION + 1}, this shardify uses {PLAN_VERSION}: resume with the shardify"),
    ({"epoch": 0, "progress": []}, "saved by plan version None"),
    ({"plan_version": True, "epoch": 0, "progress": []}, "plan version True"),
    ([1, 2], "malformed plan state"),
    ({"plan_version": PLAN_VERSION, "epoch": 0}, "keys"),
    ({"plan_version": PLAN_VERSION, "epoch": 0, "progress": [], "extra": 1}, "keys"),
    ({"plan_version": PLAN_VERSION, "epoch": -1, "progress": []}, "epoch"),
    ({"plan_version": PLAN_VERSION, "epoch": "0", "progress": []}, "epoch"),
    ({"plan_version": PLAN_VERSION, "epoch": 0, "progress": {"a": 1}}, "progress must be a list"),
    ({"plan_version": PLAN_VERSION, "epoch": 0, "progress": [[2, 2, 1]]}, "must be dicts"),
    ({"plan_version": PLAN_VERSION, "epoch": 0, "progress": [{"world_size": 2, "num_workers": 1}]}, "keys"),
    ({"plan_version": PLAN_VERSION, "epoch": 0,
      "progress": [{"world_size": 0, "num_workers": 1, "batches": 1}]}, "world_size"),
    ({"plan_version": PLAN_VERSION, "epoch": 0,
      "progress": [{"world_size": 2, "num_workers": 1, "batches": 1.5}]}, "batches"),
])
def test_malformed_or_foreign_state_is_refused(bad, message):
    with pytest.raises(StateError, match=message.replace("(", r"\(")):
        PlanState.from_dict(bad)


def test_state_of_another_plan_version_is_refused_by_the_plan():
    state = PlanState(epoch=0, plan_version=PLAN_VERSION + 1)
    slot = WorkerSlot(rank=0, world_size=1, worker_id=0, num_workers=1)
    with pytest.raises(StateError, match="resume with the shardify that saved it"):
        plan_worker([4], config=PlanConfig(seed=0, batch_size=1), slot=slot, state=state)
