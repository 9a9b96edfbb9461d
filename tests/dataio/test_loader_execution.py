"""The execution plan (loader/execution.py): how a loader makes its batches, decided once when it is
built from the config, the data and the machine, for samples and tokens alike; `describe()` says it in
one line (also in the stats), and the workers' job carries the decision (its stream kind)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from dataio import make_loader
from dataio.decode.gpu_codecs import CpuTwin
from dataio.loader.execution import ExecutionPlan
from dataio.loader.gpu_feed import device_twin
from dataio.storage.store import Store
from tests.dataio.shardgen import write_parquet_dataset
from tests.dataio.tokengen import write_token_dataset

pytestmark = pytest.mark.timeout(120)
DATAIO = Path(__file__).parents[2] / "dataio"


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> str:
    url = str(tmp_path_factory.mktemp("tokens") / "ds")
    write_token_dataset(Store(url), [[5, 1, 40, 3], [70], [2, 9, 33]], block_tokens=16)
    return url


def plan_of(url: str, **options) -> ExecutionPlan:
    with make_loader(url, rank=0, world_size=1, batch_size=2, **options) as loader:
        assert loader.describe() == loader.stats.execution == loader.execution.describe()
        assert loader.job.stream == loader.execution.stream  # the workers read the decision, never re-make it
        return loader.execution


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("options,line", [
    (dict(decode=None, num_workers=2),
     "readers=threads x2, stream=raw, first batch by the readers, decode=none"),
    (dict(decode=None, num_workers=0),
     "readers=in process, stream=raw, first window laid out ahead, decode=none"),
    (dict(decode="cpu", num_workers=2, image_size=8),
     "readers=processes x2, stream=by_sample, first batch in main, pooled buffers, decode=cpu"),
    (dict(decode="cpu", num_workers=2, image_size=8, worker_mode="threads", pooled_buffers=False),
     "readers=threads x2, stream=by_sample, first batch by the readers, decode=cpu"),
    (dict(decode=None, num_workers=2, reuse_buffers=True, worker_mode="processes", early_start=False),
     "readers=processes x2, stream=raw, first batch by the readers, reused slabs, decode=none"),
    (dict(decode="auto", num_workers=0, image_size=8),  # no CUDA device here: the CPU
     "readers=in process, stream=by_sample, first batch by the readers, pooled buffers, decode=cpu"),
])
def test_a_sample_dataset_gets_its_plan_in_one_line(dataset, options, line) -> None:
    assert plan_of(dataset, **options).describe() == line


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_hooks_caches_and_parquet_choose_sample_dicts(dataset, tmp_path) -> None:
    assert plan_of(dataset, decode=None, num_workers=2, transform=lambda s: s).stream == "decoded"
    cached = plan_of(dataset, decode="cpu", num_workers=0, image_size=8, cache_dir=str(tmp_path / "c"),
                     cache_limit_bytes=1 << 20)
    assert (cached.stream, cached.readers) == ("decoded", "caller")
    url = str(tmp_path / "pq")
    write_parquet_dataset(Store(url), [5, 3], row_group_size=2)
    parquet = plan_of(url, decode=None, num_workers=2)
    assert (parquet.stream, parquet.readers, parquet.early_start) == ("decoded", "processes", True)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("mode,readers", [("auto", "caller"), ("threads", "threads"),
                                          ("processes", "processes")])
def test_a_token_dataset_runs_the_token_stream_on_the_same_readers(tokens, mode, readers) -> None:
    plan = plan_of(tokens, seq_len=4, num_workers=2, worker_mode=mode)
    assert (plan.stream, plan.readers, plan.decode) == ("tokens", readers, "none")
    # chunks of batches made in this process reuse what the caller let go; worker processes' never
    assert plan.pooled_reads == (readers != "processes") and not plan.pooled_images
    assert not plan_of(tokens, seq_len=4, num_workers=0, pooled_buffers=False).pooled_reads


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_gpu_and_auto_have_their_decode_places(dataset) -> None:
    """decode="gpu": the workers stream RAW tar batches for the GPU feed; "auto": the CPU without a
    device, CPU workers beside the GPU feed with one (the CPU twin stands in), the CPU again with a hook."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "no GPU decoder: the CPU path" (said once)
        gpu = plan_of(dataset, decode="gpu", num_workers=2)
    assert (gpu.decode, gpu.stream, gpu.readers, gpu.first_batch) == ("gpu", "raw", "threads", "readers")
    assert plan_of(dataset, decode="auto", num_workers=2).decode == "cpu"
    with device_twin(lambda: CpuTwin()):
        hybrid = plan_of(dataset, decode="auto", num_workers=2)
        hooked = plan_of(dataset, decode="auto", num_workers=2, transform=lambda image: image)
    assert (hybrid.decode, hybrid.hybrid, hybrid.readers, hybrid.first_batch) == ("cpu+gpu", True, "processes", "readers")
    assert (hooked.decode, hooked.hybrid) == ("cpu", False)


def test_no_mode_is_decided_outside_the_execution_plan() -> None:
    """The done-check of the one execution plan: no file below make_loader re-decides a mode."""
    pattern = re.compile(r"worker_mode ==|decode ==|uses_threads|raw_fast_path|in_process|reads_by_sample|first_batch_in_main")
    allowed = {DATAIO / "loader" / "execution.py", DATAIO / "loader" / "config.py"}  # config: argument checks
    found = [f"{path}:{n}" for path in DATAIO.rglob("*.py") if path not in allowed
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []
