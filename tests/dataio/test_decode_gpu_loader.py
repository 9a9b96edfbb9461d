"""make_loader(decode="gpu" / "auto") through the GPU path's CPU twin (gpu_feed.device_twin): the same
thread, queue and code path as on a GPU, streams and events as no-ops.

Keys, labels, masks and order are identical for cpu, gpu and auto whatever decoder made a batch; pixels
agree within test_decode_gpu.MAX_MEAN_ABS_SCALED.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from dataio import make_loader
from dataio.decode.gpu_codecs import CpuTwin
from dataio.loader.gpu_feed import device_twin
from dataio.loader.hybrid import MAX_SHARE, MIN_SHARE, Split
from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_samples
from tests.dataio.test_decode_gpu import GARBAGE, MAX_MEAN_ABS_SCALED, Recording, mean_abs, photo

pytestmark = pytest.mark.timeout(120)
OPTIONS = dict(batch_size=4, image_size=32, seed=3, tail="pad")


def write(tmp_path, images: list[bytes], *, sizes=(7, 9)) -> str:
    store = Store(str(tmp_path / "ds"))
    shards, first = [], 0
    for n in sizes:
        shards.append([{"__key__": f"{i:06d}", "jpg": images[i % len(images)], "cls": i % 3}
                       for i in range(first, first + n)])
        first += n
    write_tar_samples(store, shards)
    return store.raw_url


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    return write(tmp_path_factory.mktemp("gpu"), [photo(i, (120, 90)) for i in range(16)])


def run(url: str, decode: str, *, twin: CpuTwin | None = None, **options) -> tuple[list[dict], dict]:
    with device_twin(lambda: twin) if twin is not None else warnings.catch_warnings():
        with make_loader(url, decode=decode, **{**OPTIONS, **options}) as loader:
            batches = list(loader)
            return batches, dict(loader.stats.gpu_decode, resolved=loader.config.decode)


def contract(batches: list[dict]) -> list[tuple]:
    return [(b["__key__"], b["label"].tolist(), b["mask"].tolist(), b["batch_number"]) for b in batches]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_cpu_gpu_and_auto_give_the_same_keys_labels_and_order(dataset, num_workers) -> None:
    cpu, _ = run(dataset, "cpu", num_workers=num_workers)
    gpu, gpu_stats = run(dataset, "gpu", twin=CpuTwin(), num_workers=num_workers)
    auto, auto_stats = run(dataset, "auto", twin=CpuTwin(), num_workers=num_workers)
    assert contract(gpu) == contract(auto) == contract(cpu)
    for g, a, c in zip(gpu, auto, cpu):
        assert g.keys() == c.keys() == a.keys()  # the same contract: the decoder changes nothing else
        assert g["image"].shape == c["image"].shape == (4, 3, 32, 32) and g["image"].dtype == torch.uint8
        assert mean_abs(g["image"], c["image"]) < MAX_MEAN_ABS_SCALED
        assert mean_abs(a["image"], c["image"]) < MAX_MEAN_ABS_SCALED
    assert gpu_stats["device_samples"] == 4 * len(gpu) and gpu_stats["codec"].startswith("CPU twin")
    assert auto_stats["resolved"] == "auto"
    # Both sides made batches; together exactly the epoch's.
    assert auto_stats["gpu_batches"] > 0 and auto_stats["cpu_batches"] > 0
    assert auto_stats["gpu_batches"] + auto_stats["cpu_batches"] == len(auto)
    assert auto_stats["gpu_samples_per_s"] > 0 and auto_stats["cpu_samples_per_s"] > 0
    assert MIN_SHARE <= auto_stats["gpu_share"] <= MAX_SHARE


def test_mixed_formats_exactly_once_through_the_gpu_twin(tmp_path) -> None:
    images = [photo(0), photo(1, fmt="PNG"), photo(2, mode="CMYK"), photo(3, mode="L"), photo(4, fmt="WEBP"), GARBAGE]
    url = write(tmp_path, images, sizes=(6, 6))  # whole batches: no padding repeats
    twin = Recording()
    gpu, stats = run(url, "gpu", twin=twin, num_workers=1, on_corrupt="skip", shuffle=False)
    cpu, _ = run(url, "cpu", num_workers=1, on_corrupt="skip", shuffle=False)
    assert contract(gpu) == contract(cpu)
    real = [k for b in gpu for k, m in zip(b["__key__"], b["mask"].tolist()) if m]
    assert len(real) == len(set(real)) == 12 - 2  # every sample once, the two garbage ones skipped
    jpeg_rgb_or_grey = sum(1 for i in range(12) if i % 6 in (0, 3))
    assert len(twin.seen) == stats["device_samples"] == jpeg_rgb_or_grey
    assert stats["device_samples"] + stats["cpu_path_samples"] == 12
    for g, c in zip(gpu, cpu):
        assert mean_abs(g["image"], c["image"]) < MAX_MEAN_ABS_SCALED


def test_resume_through_the_gpu_twin_delivers_exactly_the_rest(dataset) -> None:
    full, _ = run(dataset, "gpu", twin=CpuTwin(), num_workers=1)
    with device_twin(CpuTwin):
        with make_loader(dataset, decode="gpu", num_workers=1, **OPTIONS) as loader:
            it = iter(loader)
            first = [next(it) for _ in range(2)]  # the feed has decoded further ahead: not counted
            state = loader.state_dict()
            it.close()
        with make_loader(dataset, decode="gpu", num_workers=2, **OPTIONS) as loader:
            loader.load_state_dict(state)
            rest = list(loader)
    keys = [k for b in first + rest for k in b["__key__"]]
    assert sorted(keys) == sorted(k for b in full for k in b["__key__"])


def test_without_cuda_auto_is_cpu_and_gpu_decodes_on_the_cpu_said_once(dataset) -> None:
    cpu, _ = run(dataset, "cpu", num_workers=1)
    auto, stats = run(dataset, "auto", num_workers=1)
    assert stats["resolved"] == "cpu" and contract(auto) == contract(cpu)
    assert all(torch.equal(a["image"], c["image"]) for a, c in zip(auto, cpu))
    with pytest.warns(RuntimeWarning, match="no CUDA device"):
        gpu, stats = run(dataset, "gpu", num_workers=1)
    assert stats["codec"] == "none (CPU path)" and stats["cpu_path_samples"] == 4 * len(gpu)
    assert all(torch.equal(g["image"], c["image"]) for g, c in zip(gpu, cpu))


@pytest.mark.parametrize("options,message", [
    (dict(decode="gpu", reuse_buffers=True), "reuse_buffers"),
    (dict(decode="auto", reuse_buffers=True), "reuse_buffers"),
    (dict(decode="gpu", transform=lambda x: x), "hooks"),
    (dict(decode="auto", worker_mode="threads"), "worker_mode"),
])
def test_bad_combinations_are_refused(dataset, options, message) -> None:
    with pytest.raises(ValueError, match=message):
        make_loader(dataset, batch_size=4, **options)


def test_split_follows_the_measured_rates() -> None:
    split = Split(num_workers=2)
    assert [split.raw_of(k) for k in range(8)] == [False, True] * 4  # 0.5 before any measurement
    split.note("gpu", samples=300, seconds=1.0)  # 300 samples/s
    split.note("cpu", samples=50, seconds=1.0)  # 50 per worker: 100 samples/s
    assert split.gpu_share == pytest.approx(0.75)
    assert sum(split.raw_of(k) for k in range(100)) == pytest.approx(75, abs=1)
    split.note("gpu", samples=1, seconds=100.0)  # the GPU slows down: its share falls
    assert split.gpu_share < 0.75
    report = split.report()
    assert report["gpu_batches"] == 2 and report["cpu_batches"] == 1 and report["cpu_samples"] == 50
    for _ in range(50):
        split.note("cpu", samples=10_000, seconds=0.001)
    assert split.gpu_share == MIN_SHARE  # each side keeps some batches, so its rate stays measured


def test_gpu_through_nvimagecodecs_cpu_backend_keeps_the_contract(dataset) -> None:
    pytest.importorskip("nvidia.nvimgcodec")
    from dataio.decode.gpu_codecs import NvImgCodec

    cpu, _ = run(dataset, "cpu", num_workers=1)
    gpu, stats = run(dataset, "gpu", twin=NvImgCodec(torch.device("cpu")), num_workers=1)
    assert contract(gpu) == contract(cpu) and stats["codec"].startswith("nvImageCodec")
    assert stats["device_samples"] == 4 * len(gpu)
    assert all(mean_abs(g["image"], c["image"]) < MAX_MEAN_ABS_SCALED for g, c in zip(gpu, cpu))


def test_a_mixture_and_parquet_get_the_cpu_paths_crops_through_the_gpu_twin(tmp_path, dataset) -> None:
    # Seeds come from global sample ids rebuilt from each batch's source, shard and position: a wrong
    # id would give another crop, far beyond the tolerance.
    from tests.dataio.shardgen import write_parquet_dataset

    parquet = Store(str(tmp_path / "pq"))
    write_parquet_dataset(parquet, [5, 7], real_images=True)
    other = write(tmp_path / "other", [photo(i, (100, 80)) for i in range(20, 30)], sizes=(5, 6))
    for url in ([dataset, other], parquet.raw_url):
        cpu, _ = run(url, "cpu", num_workers=1)
        gpu, _ = run(url, "gpu", twin=CpuTwin(), num_workers=1)
        assert contract(gpu) == contract(cpu)
        assert all(mean_abs(g["image"], c["image"]) < MAX_MEAN_ABS_SCALED for g, c in zip(gpu, cpu))


def test_a_corrupt_sample_raises_from_the_feed_thread_naming_it(tmp_path) -> None:
    from dataio import CorruptSampleError

    url = write(tmp_path, [photo(0), photo(1), GARBAGE], sizes=(6,))
    with pytest.raises(CorruptSampleError, match="000002"):
        run(url, "gpu", twin=CpuTwin(), num_workers=1, shuffle=False)


def test_a_new_iteration_stops_the_feed_thread_of_one_left_open(dataset) -> None:
    import threading

    with device_twin(CpuTwin):
        with make_loader(dataset, decode="gpu", num_workers=1, **OPTIONS) as loader:
            steps = len(loader)
            old = iter(loader)
            first = next(old)
            new = list(loader)  # the old iteration's thread is stopped before the new one reads
            assert len(new) == steps - 1  # it goes on where the one left open stopped
            keys = [k for b in [first, *new] for k in b["__key__"]]
            assert len(keys) == len(set(keys)) == 4 * steps
            with pytest.raises(RuntimeError, match="newer iteration"):
                next(old)
    assert not [t for t in threading.enumerate() if t.name == "dataio-gpu-feed"]
