"""Fixtures of the dataio tests: the small real-image tar dataset most loader tests read."""

from __future__ import annotations

import pytest

from dataio.storage.store import Store
from tests.dataio.loader_helpers import SIZES
from tests.dataio.shardgen import write_tar_dataset


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    """URL of a tar dataset of SIZES shards with real JPEGs; read-only: tests must not change it."""
    root = str(tmp_path_factory.mktemp("loader") / "ds")
    write_tar_dataset(Store(root), SIZES, real_images=True)
    return root
