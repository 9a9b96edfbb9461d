"""Fixtures of the dataio tests: the small real-image tar dataset most loader tests read, and one
with a corrupt JPEG."""

from __future__ import annotations

import pytest

from dataio.storage.store import Store
from tests.dataio.loader_helpers import SIZES
from tests.dataio.shardgen import make_samples, write_tar_dataset, write_tar_samples


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    """URL of a tar dataset of SIZES shards with real JPEGs; read-only: tests must not change it."""
    root = str(tmp_path_factory.mktemp("loader") / "ds")
    write_tar_dataset(Store(root), SIZES, real_images=True)
    return root


@pytest.fixture(scope="session")
def corrupt_dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(URL, key): two shards of real JPEGs, the second's third sample not a JPEG; read-only."""
    shards = make_samples([6, 5], real_images=True)
    shards[1][2]["jpg"] = b"\xff\xd8 this is not a jpeg"
    root = str(tmp_path_factory.mktemp("corrupt") / "ds")
    write_tar_samples(Store(root), shards)
    return root, shards[1][2]["__key__"]
