"""Token loader states saved by commit f37d7f7 (before the token loader's mixture of one) load into
today's loader and deliver the same batches, bit for bit: every tensor's checksum.

tests/fixtures/token_states_f37d7f7/states.json was written by its generate.py running that commit's
code; the datasets are regenerated here, byte for byte, at the same memory:// URLs. A single dataset's
state has no 'mixture' key, and saving it again gives the same state, key for key.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.dataio.loader_helpers import cleaned_memory_root
from tests.fixtures.token_states_f37d7f7.generate import ROOT, datasets, loader_of, summary

FIXTURE = Path(__file__).parents[1] / "fixtures" / "token_states_f37d7f7" / "states.json"
CASES = json.loads(FIXTURE.read_text())


@pytest.fixture
def memory_root():
    yield from cleaned_memory_root(ROOT)


@pytest.mark.parametrize("name", sorted(CASES))
def test_old_token_state_resumes_to_the_same_batches(name: str, memory_root: str) -> None:
    case = CASES[name]
    a, b = datasets(f"{memory_root}/{name}")
    with loader_of(a, b, case) as loader:
        loader.load_state_dict(case["state"])
        assert loader.state_dict() == case["state"]
        assert ("mixture" in case["state"]) == case["mixed"]
        rest = [summary(batch) for batch in loader]
    assert rest == case["rest"]
