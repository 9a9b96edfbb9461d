"""ShardLoader through the resume harness: stop anywhere, save, load into fresh loaders of the same or
another topology, and the rest of the epoch (and the next) is exactly what an uninterrupted run
delivers. Hypothesis runs every rank in one process (num_workers=0, rank/world_size passed); a few
fixed examples use worker processes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataio import make_loader
from dataio.storage.store import Store
from tests.dataio.loader_helpers import batch_summary, summary_keys
from tests.dataio.resume_harness import (
    check_resume,
    check_save_load_state,
    loader_advance,
    loader_deliver,
)
from tests.dataio.shardgen import write_parquet_dataset, write_tar_dataset

pytestmark = pytest.mark.timeout(300)
SIZES = [9, 0, 5, 1, 14]  # uneven, with an empty and a one-sample shard: 29 samples
TOTAL = sum(SIZES)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tar and a Parquet dataset of the same real-JPEG samples."""
    root = tmp_path_factory.mktemp("resume")
    write_tar_dataset(Store(str(root / "tar")), SIZES, real_images=True)
    write_parquet_dataset(Store(str(root / "parquet")), SIZES, row_group_size=4, real_images=True)
    return {"tar": str(root / "tar"), "parquet": str(root / "parquet")}


@st.composite
def loader_options(draw: st.DrawFn) -> dict:
    return dict(
        batch_size=draw(st.integers(1, 5)), seed=draw(st.integers(0, 2**32)),
        tail=draw(st.sampled_from(["drop", "pad"])), shuffle_window=draw(st.sampled_from([1, 3, 8, 4096])),
        decode=draw(st.sampled_from([None, "cpu"])), image_size=8,
    )


def ranks_at(url: str, options: dict, world_size: int, num_workers: int = 0) -> list:
    """One loader per rank of a world_size job, all in this process."""
    return [make_loader(url, rank=rank, world_size=world_size, num_workers=num_workers, **options)
            for rank in range(world_size)]


def assert_exactly_once(delivered: list[str], options: dict, final_world_size: int) -> None:
    assert len(delivered) == len(set(delivered))
    if options["tail"] == "pad":
        assert sorted(delivered) == sorted(f"{i:06d}" for i in range(TOTAL))
    else:
        assert TOTAL - len(delivered) < final_world_size * options["batch_size"]


@SETTINGS
@given(fmt=st.sampled_from(["tar", "parquet"]), options=loader_options(), world_size=st.integers(1, 4),
       stop=st.integers(0, 30))
def test_stop_save_load_matches_the_uninterrupted_run(datasets, fmt, options, world_size, stop) -> None:
    url = datasets[fmt]
    check_save_load_state(lambda: ranks_at(url, options, world_size), stop=stop, summary=batch_summary)


@SETTINGS
@given(fmt=st.sampled_from(["tar", "parquet"]), options=loader_options(), first=st.integers(1, 4),
       second=st.integers(1, 4), data=st.data())
def test_resume_at_another_world_size_delivers_exactly_the_rest(datasets, fmt, options, first, second,
                                                                data) -> None:
    url = datasets[fmt]
    options = {**options, "decode": None}  # which samples, not their pixels: the other test checks those
    with make_loader(url, rank=0, world_size=first, num_workers=0, **options) as loader:
        steps = len(loader)
    stop = data.draw(st.integers(0, steps), label="stop")
    make_at = lambda topology: ranks_at(url, options, *topology)  # noqa: E731
    delivered, _ = check_resume(loader_deliver(make_at, batch_summary), loader_advance(make_at), summary_keys,
                                None, [((first, 0), stop), ((second, 0), None)])
    assert_exactly_once(delivered, options, second)


# --- fixed examples with worker processes -----------------------------------------------------------


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core machine: fine here
@pytest.mark.parametrize("fmt,decode,world_size,num_workers,stop", [
    ("tar", "cpu", 2, 2, 3),
    ("parquet", None, 1, 3, 4),
])
def test_stop_save_load_with_worker_processes(datasets, fmt, decode, world_size, num_workers, stop) -> None:
    options = dict(batch_size=2, decode=decode, image_size=8, shuffle_window=4, tail="pad")
    used = check_save_load_state(lambda: ranks_at(datasets[fmt], options, world_size, num_workers), stop=stop,
                                 summary=batch_summary)
    assert used == stop  # the stop fell inside the epoch


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_resume_across_topologies_with_worker_processes(datasets, fmt) -> None:
    options = dict(batch_size=2, decode=None, shuffle_window=4, tail="drop")
    make_at = lambda topology: ranks_at(datasets[fmt], options, *topology)  # noqa: E731
    schedule = [((2, 2), 2), ((3, 1), 1), ((1, 0), None)]  # 2 ranks x 2 workers, 3 x 1, then one in-process
    delivered, _ = check_resume(loader_deliver(make_at, batch_summary), loader_advance(make_at), summary_keys,
                                None, schedule)
    assert_exactly_once(delivered, options, 1)
