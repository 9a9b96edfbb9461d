"""States saved by earlier commits load into today's loader and deliver the same batches, for both
kinds of data the one loader reads:

- samples, commit 91bd3a1 (before the stream floor and the mixture of one): keys, mask, labels and
  sources; saving again gives the same state, key for key, plus the run history states now carry;
- tokens, commit f37d7f7 (before the token loader's mixture of one and the one spine): every tensor's
  checksum, bit for bit; saving again gives the same state, key for key.

Each fixture's states.json was written by its generate.py running that commit's code; the datasets
are regenerated here, byte for byte, at the same memory:// URLs.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest

from tests.dataio.loader_helpers import cleaned_memory_root
from tests.fixtures.states_91bd3a1 import generate as samples_91bd3a1
from tests.fixtures.token_states_f37d7f7 import generate as tokens_f37d7f7

FIXTURES = Path(__file__).parents[1] / "fixtures"
KINDS: dict[str, tuple[ModuleType, dict]] = {
    "samples": (samples_91bd3a1, json.loads((FIXTURES / "states_91bd3a1" / "states.json").read_text())),
    "tokens": (tokens_f37d7f7, json.loads((FIXTURES / "token_states_f37d7f7" / "states.json").read_text())),
}


def open_case(kind: str, root: str, case: dict):
    """The loader the fixture's generate.py saved `case` from, over its datasets regenerated under root."""
    if kind == "samples":
        a, b = samples_91bd3a1.datasets(root, case["format"])
        return samples_91bd3a1.loader_of(a, b, case["mixed"], case["num_workers"])
    a, b = tokens_f37d7f7.datasets(root)
    return tokens_f37d7f7.loader_of(a, b, case)


@pytest.mark.parametrize("kind,name", [(kind, name) for kind, (_, cases) in KINDS.items() for name in sorted(cases)])
def test_old_state_resumes_to_the_same_batches(kind: str, name: str) -> None:
    module, cases = KINDS[kind]
    case = cases[name]
    with contextmanager(cleaned_memory_root)(module.ROOT) as root:
        with open_case(kind, f"{root}/{name}", case) as loader:
            loader.load_state_dict(case["state"])
            state = loader.state_dict()
            assert ("mixture" in case["state"]) == case["mixed"]
            if kind == "samples":  # saved before states carried the run's history (for `shardify which`)
                assert "history" not in case["state"]
                state.pop("history")
            assert state == case["state"]
            rest = [module.summary(batch) for batch in loader]
        assert rest == case["rest"]
