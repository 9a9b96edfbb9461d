"""The fault-injection suite's short form (`python -m tools.faults --short`): correctness only.

Every scenario must pass (exactly once, complete or clean failure, corruption refused, checkpoint
fallback); throughput ratios are in benchmarks/results_faults.md and never asserted here.
"""

from __future__ import annotations

import pytest

from tools.faults import run_suite, to_markdown

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_short_fault_suite_is_correct(s3_server, tmp_path):
    rows = run_suite(s3_server, tmp_path, short=True)
    text = to_markdown(rows, short=True, machine="CI", seconds=0)
    assert {r.group for r in rows} == {"loader", "write", "kill", "corrupt", "checkpoint", "trainer"}
    assert all(r.passed for r in rows), text
    # The faults were really injected (a fault-free run proves nothing).
    for r in rows:
        if r.group == "loader" and r.scenario != "epoch through no fault":
            assert "0 503s, 0 resets, 0 truncated, 0 hung, 0 stalled" not in r.note, text
