"""Part size and parts in flight from measured throughput (dataio/storage/tune.py), on a fake clock, and a
read from SeaweedFS with it on."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from dataio.storage import tune
from dataio.storage.options import StorageOptions
from dataio.storage.store import Store
from dataio.storage.tune import FORGET_S, MIN_PART_BYTES, TARGET_PART_S, PartTuner

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _round(tuner: PartTuner, clock: Clock, rate_per_request: float, part: int = 8 * MiB) -> int:
    """One round of parts at `rate_per_request` bytes/s each (as many as are in flight); the level after."""
    for _ in range(tuner.in_flight):
        clock.now += 0.01
        tuner.finished(part, part / rate_per_request)
    return tuner.in_flight


def test_starts_at_two_parts_and_grows_to_the_caps_while_each_request_keeps_its_rate():
    clock = Clock()
    tuner = PartTuner(max_part_bytes=8 * MiB, max_in_flight=8, clock=clock)
    assert tuner.plan() == tune.PartPlan(part_bytes=8 * MiB, in_flight=tune.START_IN_FLIGHT)
    levels = [_round(tuner, clock, 500 * MiB) for _ in range(10)]  # a fast link: every request keeps its rate
    assert levels == [3, 4, 5, 6, 7, 8, 8, 8, 8, 8]  # one more per round, never above the cap
    assert tuner.plan().part_bytes == 8 * MiB
    assert PartTuner(max_part_bytes=MiB, max_in_flight=1).plan().in_flight == 1  # a cap below the start wins


def test_a_level_that_moves_no_more_than_the_one_below_is_left_for_it():
    clock = Clock()
    tuner = PartTuner(max_part_bytes=8 * MiB, max_in_flight=8, clock=clock)
    cores = 600 * MiB  # what the machine receives in all, however many requests share it (loopback)
    levels = [_round(tuner, clock, cores / tuner.in_flight) for _ in range(6)]
    assert levels == [3, 2, 2, 2, 2, 2]  # 3 moved no more than 2: back, and 3 is not tried again
    assert _round(tuner, clock, cores / 2) == 2
    clock.now += FORGET_S + 1
    assert _round(tuner, clock, cores / 2) == 3  # forgotten: tried again


def test_errors_halve_the_parts_in_flight_and_a_steady_rate_grows_them_back_to_the_cap():
    clock = Clock()
    tuner = PartTuner(max_part_bytes=8 * MiB, max_in_flight=8, clock=clock)
    assert [_round(tuner, clock, 100 * MiB) for _ in range(6)][-1] == 8
    for _ in range(8):  # a round with a failed part
        tuner.failed()
    assert tuner.in_flight == 4
    tuner.failed(), tuner.failed(), tuner.failed(), tuner.failed()
    assert tuner.in_flight == 2
    levels = [_round(tuner, clock, 100 * MiB) for _ in range(8)]
    assert levels[:6] == [3, 4, 5, 6, 7, 8] and levels[-1] == 8  # one more per round, capped


def test_a_stalled_part_counts_as_trouble():
    clock = Clock()
    tuner = PartTuner(max_part_bytes=8 * MiB, max_in_flight=4, clock=clock)
    assert [_round(tuner, clock, 100 * MiB) for _ in range(3)] == [3, 4, 4]  # 4 is measured: 0.08 s a part
    for _ in range(3):
        tuner.finished(8 * MiB, 0.08)
    tuner.finished(8 * MiB, 1.0)  # more than STALL_FACTOR x expected
    assert tuner.in_flight == 2


def test_more_parts_stop_where_each_request_only_gets_a_share_of_the_link():
    clock = Clock()
    tuner = PartTuner(max_part_bytes=8 * MiB, max_in_flight=8, clock=clock)
    for _ in range(8 + 4 + 2):  # rounds of failures: 8 -> 4 -> 2 -> 1
        tuner.failed()
    assert tuner.in_flight == 1
    link = 400 * MiB  # the link's total; one request alone gets at most 200 MiB/s
    levels = [_round(tuner, clock, min(200 * MiB, link / tuner.in_flight)) for _ in range(6)]
    # 2 in flight: 200 each (held); 3: 133 each, below 0.8 x 200: back to 2, which fills the link, and stays
    assert levels == [2, 3, 2, 2, 2, 2]


def test_a_slow_level_is_tried_again_once_its_rate_is_forgotten():
    clock = Clock()
    tuner = PartTuner(max_part_bytes=8 * MiB, max_in_flight=3, clock=clock)
    tuner.failed(), tuner.failed(), tuner.failed()  # 3 -> 1
    assert _round(tuner, clock, 100 * MiB) == 2
    assert _round(tuner, clock, 40 * MiB) == 1  # each request slower at 2: back to 1
    assert _round(tuner, clock, 100 * MiB) == 1  # 2 is known to be slow
    clock.now += FORGET_S + 1
    assert _round(tuner, clock, 100 * MiB) == 2  # forgotten: tried again


def test_parts_shrink_to_a_quarter_second_of_a_slow_request_but_not_below_the_floor():
    clock = Clock()
    tuner = PartTuner(max_part_bytes=8 * MiB, max_in_flight=2, clock=clock)
    _round(tuner, clock, 8 * MiB)  # 8 MiB/s per request
    assert tuner.plan().part_bytes == int(8 * MiB * TARGET_PART_S)
    slow = PartTuner(max_part_bytes=8 * MiB, max_in_flight=1, clock=clock)
    _round(slow, clock, 0.5 * MiB, part=MiB)  # 2 s a part of 1 MiB
    assert slow.plan().part_bytes == MIN_PART_BYTES
    small = PartTuner(max_part_bytes=300, max_in_flight=2, clock=clock)  # a cap below the floor wins
    _round(small, clock, 1000, part=300)
    assert small.plan().part_bytes == 300


def _wait_for_a_slot(tuner: PartTuner, cancel: threading.Event, entered: list[bool]) -> threading.Thread:
    def run() -> None:
        with tuner.slot(cancel) as holding:
            entered.append(holding)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_slots_let_in_as_many_parts_as_the_level_and_a_cancelled_read_stops_waiting():
    tuner = PartTuner(max_part_bytes=MiB, max_in_flight=8)  # at START_IN_FLIGHT (2) until measured
    cancel, entered = threading.Event(), []
    with tuner.slot(cancel) as a, tuner.slot(cancel) as b:
        assert a and b
        thread = _wait_for_a_slot(tuner, cancel, entered)
        time.sleep(3 * tune.GATE_RECHECK_S)
        assert entered == []  # a third part of the process waits
        cancel.set()  # its read failed elsewhere
        thread.join(5)
        assert entered == [False]
    go, entered = threading.Event(), []
    with tuner.slot(go), tuner.slot(go):
        thread = _wait_for_a_slot(tuner, go, entered)
        time.sleep(3 * tune.GATE_RECHECK_S)
        assert entered == []
    thread.join(5)  # a slot came free: it went in
    assert entered == [True]


def test_caps_are_checked():
    with pytest.raises(ValueError, match="caps"):
        PartTuner(max_part_bytes=0, max_in_flight=1)
    with pytest.raises(TypeError, match="adapt_parts"):
        StorageOptions(adapt_parts=1)  # type: ignore[arg-type]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("adapt", [True, False])
def test_reads_from_seaweedfs_are_exact_with_parts_tuned_or_fixed(s3_server, adapt):
    options = dataclasses.replace(s3_server.options(), part_bytes=64 << 10, parts_in_flight=4, adapt_parts=adapt)
    store = Store(f"s3://{s3_server.new_bucket()}/ds", options)
    data = bytes(range(251)) * 8000  # ~2 MB: ~30 parts a read, rounds enough to tune
    store.write_bytes("blob", data)
    tuner = tune.tuner_for(store._range_options)
    before = dict(tuner._rates)
    for start, end in [(0, len(data)), (7, len(data) - 5), (100_000, 1_500_000)] * 3:
        dest = bytearray(end - start)
        store.read_into("blob", start, end, memoryview(dest), object_size=len(data))
        assert dest == data[start:end]
    assert 1 <= tuner.in_flight <= 4 and tuner.plan().part_bytes <= 64 << 10
    assert (tuner._rates != before) == adapt  # measured only when on
