"""The fault-injection suite's short form (`python -m tools.faults --short`): correctness only.

Every scenario must pass (exactly once, complete or clean failure, corruption refused, checkpoint
fallback); throughput ratios are in benchmarks/results_faults.md and never asserted here.
"""

from __future__ import annotations

import inspect
import re

import pytest

from tools.faults import run_suite, to_markdown

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


GROUPS = ("loader", "write", "kill", "corrupt", "checkpoint", "trainer")


@pytest.mark.parametrize("group", GROUPS)  # one test each: `make test -n` runs the groups side by side
def test_short_fault_suite_is_correct(group, s3_server, tmp_path):
    rows = run_suite(s3_server, tmp_path, short=True, groups=(group,))
    text = to_markdown(rows, short=True, machine="CI", seconds=0)
    assert rows and {r.group for r in rows} == {group}
    assert all(r.passed for r in rows), text
    # The faults were really injected (a fault-free run proves nothing).
    for r in rows:
        if r.group == "loader" and r.scenario != "epoch through no fault":
            assert sum(injected(r.note).values()) > 0, text


def test_the_suite_runs_every_group_by_default():
    assert inspect.signature(run_suite).parameters["groups"].default == GROUPS


def injected(note: str) -> dict[str, int]:
    """The proxy's fault counts in a row's note ("proxy: 74 requests, 10 503s, 0 resets, ...")."""
    counts = {kind: int(n) for n, kind in re.findall(r"\b(\d+) (503s|resets|truncated|hung|stalled)\b", note)}
    assert len(counts) == 5, note
    return counts


def test_injected_reads_each_count_whole():
    # "10 503s" holds the text "0 503s": a substring test took ten 503s for none (a CI failure)
    note = "proxy: 74 requests, 10 503s, 0 resets, 0 truncated, 0 hung, 0 stalled"
    assert injected(note) == {"503s": 10, "resets": 0, "truncated": 0, "hung": 0, "stalled": 0}
    assert sum(injected(note.replace("10 503s", "0 503s")).values()) == 0
