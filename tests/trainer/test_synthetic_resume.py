"""The trainer's in-memory loader through the same resume harness as ShardLoader."""

from __future__ import annotations

import pytest

from tests.dataio.loader_helpers import batch_summary
from tests.dataio.resume_harness import check_save_load_state
from trainer.synthetic import synthetic_loader


def summary(batch: dict) -> tuple:
    # MemoryLoader numbers a resumed iteration's batches from 0 again (ShardLoader continues the
    # epoch's count); nothing in the trainer reads batch_number, so only the samples are compared.
    return batch_summary({k: v for k, v in batch.items() if k != "batch_number"})


@pytest.mark.parametrize("world_size,tail,prefetch", [(1, "drop", 0), (2, "pad", 0), (3, "drop", 2)])
@pytest.mark.parametrize("stop", [0, 1, 3, 100])
def test_memory_loader_stops_saves_and_resumes(world_size, tail, prefetch, stop) -> None:
    url = f"synthetic:?samples=37&classes=5&prefetch={prefetch}"

    def make() -> list:
        return [synthetic_loader(url, batch_size=4, rank=rank, world_size=world_size, seed=3, image_size=4,
                                 tail=tail) for rank in range(world_size)]

    check_save_load_state(make, stop=stop, summary=summary)
