"""States saved by the loader of commit 91bd3a1 (before the stream floor and the mixture of one)
load into today's loader and deliver the same batches: keys, mask, labels and sources.

tests/fixtures/states_91bd3a1/states.json was written by its generate.py running that commit's
code; the datasets are regenerated here, byte for byte, at the same memory:// URLs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.dataio.loader_helpers import cleaned_memory_root
from tests.fixtures.states_91bd3a1.generate import ROOT, datasets, loader_of, summary

FIXTURE = Path(__file__).parents[1] / "fixtures" / "states_91bd3a1" / "states.json"
CASES = json.loads(FIXTURE.read_text())


@pytest.fixture
def memory_root():
    yield from cleaned_memory_root(ROOT)


@pytest.mark.parametrize("name", sorted(CASES))
def test_old_state_resumes_to_the_same_batches(name: str, memory_root: str) -> None:
    case = CASES[name]
    a, b = datasets(f"{memory_root}/{name}", case["format"])
    with loader_of(a, b, case["mixed"], case["num_workers"]) as loader:
        loader.load_state_dict(case["state"])
        state = loader.state_dict()
        # The same state, key for key, plus the run history that states now carry (for `shardify
        # which`); a state saved before it answers only for its own epoch, and resumes as before.
        assert {k: v for k, v in state.items() if k != "history"} == case["state"]
        assert "history" not in case["state"]
        rest = [summary(batch) for batch in loader]
    assert rest == case["rest"]
