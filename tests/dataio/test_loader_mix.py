"""The loader over a mixture of datasets: tar and Parquet, local and s3://, weights, resume, refusals."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
import torch

from dataio import CorruptSampleError, ManifestError, Source, StateError, make_loader
from dataio.format.manifest import Field, read_manifest, write_manifest
from dataio.loader.config import read_ahead_bytes
from dataio.storage.store import Store
from tests.dataio.loader_helpers import batch_summary, take
from tests.dataio.resume_harness import (
    check_resume,
    check_save_load_state,
    loader_advance,
    loader_deliver,
)
from tests.dataio.shardgen import write_parquet_dataset, write_tar_dataset

TAR_SIZES = [13, 0, 7, 1, 22, 5]  # 48 samples, uneven, an empty and a one-sample shard
PARQUET_SIZES = [10, 6]  # 16 samples


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("mix")
    tar, parquet = str(root / "tar"), str(root / "parquet")
    write_tar_dataset(Store(tar), TAR_SIZES, real_images=True)
    write_parquet_dataset(Store(parquet), PARQUET_SIZES, real_images=True, seed=1)
    return tar, parquet


def delivered(batches: list[dict]) -> list[tuple[int, str]]:
    """(source, key) of the real samples, in delivery order."""
    return [(s, k) for b in batches for s, k, m in zip(b["source"].tolist(), b["__key__"], b["mask"].tolist()) if m]


def test_tar_and_parquet_blend_by_weight_with_a_source_index(sources) -> None:
    tar, parquet = sources
    # An epoch of 64: 32 each, so the tar source is down-sampled and the Parquet one read twice.
    with make_loader([tar, parquet], weights=[1, 1], batch_size=4, num_workers=2, decode=None, tail="pad",
                     shuffle_window=8) as loader:
        assert loader.mixture.counts.tolist() == [32, 32] and len(loader) == 16
        batches = list(loader)
    first_of_shard = {0: [0, 13, 13, 20, 21, 43], 1: [0, 10]}  # keys number each source's samples in order
    for b in batches:
        assert b["source"].dtype == torch.int64 and b["source"].shape == (4,)
        assert b["label"].tolist() == [int(k) % 10 for k in b["__key__"]]  # each source's own labels
        for s, key, shard, position in zip(b["source"].tolist(), b["__key__"], b["__shard__"].tolist(),
                                           b["__position__"].tolist()):
            assert first_of_shard[s][shard] + position == int(key)  # where the sample lies in its own source
    seen = Counter(delivered(batches))
    assert Counter(s for s, _ in seen.elements()) == {0: 32, 1: 32}
    assert all(n == 1 for (s, _), n in seen.items() if s == 0)  # 32 distinct of the tar's 48
    assert sorted(n for (s, _), n in seen.items() if s == 1) == [2] * 16  # every Parquet sample twice


def test_one_url_in_a_list_is_the_plain_case(sources) -> None:
    tar, _ = sources
    options = {"batch_size": 4, "num_workers": 0, "decode": None, "shuffle_window": 8}
    with make_loader([tar], **options) as listed, make_loader(tar, **options) as plain:
        assert listed.mixture.single
        a, b = list(listed), list(plain)
    assert [x["__key__"] for x in a] == [x["__key__"] for x in b] and "source" not in a[0]


def mixed_summary(batch: dict) -> tuple:
    """What must match between runs: (source, key, real) per sample, and the batch number."""
    return (tuple(zip(batch["source"].tolist(), batch["__key__"], batch["mask"].tolist())), batch["batch_number"])


def mixed_keys(summary: tuple) -> list[tuple[int, str]]:
    return [(s, k) for s, k, real in summary[0] if real]


def mixed_ranks(sources: tuple[str, str], options: dict, world_size: int, num_workers: int = 0) -> list:
    tar, parquet = sources
    return [make_loader([Source(tar, weight=0.75), Source(parquet, weight=0.25)], rank=rank, world_size=world_size,
                        num_workers=num_workers, **options) for rank in range(world_size)]


@pytest.mark.parametrize("decode,world_size,num_workers,stop", [("cpu", 2, 2, 3), (None, 3, 0, 2)])
def test_mixture_stop_save_load_matches_the_uninterrupted_run(sources, decode, world_size, num_workers, stop) -> None:
    options = dict(batch_size=3, decode=decode, image_size=8, shuffle_window=5, tail="pad")
    used = check_save_load_state(lambda: mixed_ranks(sources, options, world_size, num_workers), stop=stop,
                                 summary=mixed_summary)
    assert used == stop


def test_mixture_resumes_on_other_topologies_exactly_once(sources) -> None:
    # Weights 3:1 of the default 64-sample epoch: every sample of both sources exactly once.
    options = dict(batch_size=3, decode=None, shuffle_window=5, tail="drop")
    make_at = lambda topology: mixed_ranks(sources, options, *topology)
    schedule = [((2, 2), 3), ((3, 1), 2), ((1, 0), None)]
    got, _ = check_resume(loader_deliver(make_at, mixed_summary), loader_advance(make_at), mixed_keys, None,
                          schedule)
    everything = {(0, f"{i:06d}") for i in range(48)} | {(1, f"{i:06d}") for i in range(16)}
    assert len(got) == len(set(got)) and set(got) <= everything
    # The epoch is first rounded down to the first topology's global batch (64 -> 60), then only the
    # last stage's tail (below its global batch) can be dropped.
    assert 0 <= 64 // (2 * 3) * (2 * 3) - len(got) < 1 * 3


def test_state_of_another_mixture_is_refused_naming_it(sources) -> None:
    tar, parquet = sources
    options = {"batch_size": 4, "num_workers": 0, "decode": None}
    with make_loader([tar, parquet], weights=[0.75, 0.25], **options) as loader:
        take(loader, 2)
        state = loader.state_dict()
    with make_loader([tar, parquet], weights=[0.5, 0.5], **options) as other:
        with pytest.raises(StateError, match=r"source 0 \(.*tar\) had weight 0.75 when saved, this mixture has 0.5"):
            other.load_state_dict(state)
    with make_loader(tar, **options) as single:
        with pytest.raises(StateError, match="saved by a mixture of 2 sources"):
            single.load_state_dict(state)
        plain_state = single.state_dict()
    with make_loader([tar, parquet], weights=[0.75, 0.25], **options) as mixed:
        with pytest.raises(StateError, match="saved by a single-dataset loader"):
            mixed.load_state_dict(plain_state)
        mixed.load_state_dict(state)  # its own mixture's state loads
        assert len(mixed) == 16 - 2


def test_sources_whose_fields_differ_give_the_fields_all_share(sources, tmp_path) -> None:
    """Fields some sources lack are left out (once refused, with advice leading to a second error);
    only a field asked for by name that a source lacks is refused, naming it and the source."""
    tar, _ = sources
    narrow = Store(str(tmp_path / "narrow"))
    manifest, _ = write_parquet_dataset(narrow, [5], seed=2, real_images=True)
    write_manifest(narrow, dataclasses.replace(
        manifest, fields=(Field(name="jpg", type="image"), Field(name="cls", type="int"))))
    assert read_manifest(narrow).field_names == ("jpg", "cls")
    for decode in (None, "cpu"):
        with make_loader([tar, narrow.raw_url], batch_size=2, num_workers=0, decode=decode, image_size=8) as loader:
            keys = {k for b in loader for k in b if not k.startswith("__")}
        assert keys == {"label", "source", "mask", "read_s", "decode_s", "batch_number",
                        "jpg" if decode is None else "image"}  # no `json`: the narrow source has none
    with pytest.raises(ManifestError, match=r"narrow: this source has no field 'json' .* leave \['json'\] out"):
        make_loader([tar, narrow.raw_url], batch_size=2, num_workers=0, decode=None, fields=["jpg", "json"])
    with make_loader([tar, narrow.raw_url], batch_size=2, num_workers=0, decode=None, fields=["jpg", "cls"]) as ok:
        assert set(next(iter(ok))) >= {"jpg", "label", "source"}


def test_repeat_and_bad_arguments(sources) -> None:
    tar, parquet = sources
    with make_loader([Source(tar), Source(parquet, repeat=2)], batch_size=4, num_workers=0, decode=None) as loader:
        assert loader.mixture.counts.tolist() == [48, 32]
    with pytest.raises(ValueError, match="one weight per URL"):
        make_loader([tar, parquet], weights=[1], batch_size=4)
    with pytest.raises(ValueError, match="a weight or a repeat, not both"):
        Source(tar, weight=1, repeat=2)
    with pytest.raises(ValueError, match="smaller than the repeat sources"):
        make_loader([Source(tar, repeat=1), parquet], epoch_samples=10, batch_size=4, num_workers=0, decode=None)


def test_local_and_s3_sources_mix(sources, moto_s3) -> None:
    tar, _ = sources
    remote = Store(f"s3://{moto_s3.new_bucket()}/pq", moto_s3.options())
    write_parquet_dataset(remote, PARQUET_SIZES, seed=3)
    with make_loader([tar, remote.raw_url], weights=[0.75, 0.25], batch_size=4, num_workers=1, decode=None,
                     storage=moto_s3.options()) as loader:
        got = delivered(list(loader))
    assert Counter(s for s, _ in got) == {0: 48, 1: 16}


def test_each_source_labels_come_from_its_own_label_field(sources, tmp_path) -> None:
    """A Hugging Face style Parquet source (image column, int `label`) mixes with a tar one (`jpg`, `cls`)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from dataio.format.manifest import Manifest, checksum_bytes
    from tests.dataio.shardgen import tiny_jpeg

    tar, _ = sources
    store = Store(str(tmp_path / "hf"))
    table = pa.table({"__key__": pa.array([f"hf{i:03d}" for i in range(8)]),
                      "image": pa.array([tiny_jpeg(i) for i in range(8)], pa.binary()),
                      "label": pa.array([7] * 8, pa.int64())})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=4)
    store.write_bytes("shards/shard-000000.parquet", buf.getvalue())
    write_manifest(store, Manifest(
        format="parquet", fields=(Field(name="image", type="image"), Field(name="label", type="int")),
        shard_paths=("shards/shard-000000.parquet",), shard_num_samples=(8,), shard_num_bytes=(len(buf.getvalue()),),
        shard_checksums=(checksum_bytes(buf.getvalue()),), row_groups=((4, 4),), source="test"))
    with make_loader([tar, store.raw_url], weights=[0.5, 0.5], epoch_samples=16, batch_size=4, num_workers=0,
                     decode="cpu", image_size=8, fields=["jpg", "image"]) as loader:
        batches = list(loader)
    labels = {(s, k): y for b in batches for s, k, y in zip(b["source"].tolist(), b["__key__"], b["label"].tolist())}
    assert {y for (s, _), y in labels.items() if s == 1} == {7}  # the Parquet source's `label` column
    assert all(y == int(k) % 10 for (s, k), y in labels.items() if s == 0)  # the tar source's `cls`
    assert all(b["image"].shape == (4, 3, 8, 8) for b in batches)


# A mixture under torchrun resumed on another world size: tests/dataio/test_loader_dist.py (one job with
# the plain dataset's).


def test_one_window_and_one_prefetch_budget_for_all_sources(sources) -> None:
    """The shuffle window is sized from the mixture's mean sample, not multiplied by the sources."""
    from dataio.format.manifest import read_manifest

    tar, parquet = sources
    manifests = [read_manifest(Store(u)) for u in (tar, parquet)]
    budget = 20_000
    with make_loader([tar, parquet], weights=[3, 1], batch_size=4, num_workers=0, decode=None,
                     shuffle_window_bytes=budget) as loader:
        counts, total = loader.mixture.counts.tolist(), loader.mixture.total
        mean = sum(c / total * m.num_bytes / m.num_samples for c, m in zip(counts, manifests))
        assert loader.plan_config.shuffle_window == int(budget // mean)
        job = loader.job
        assert job.prefetch_bytes == read_ahead_bytes(loader.config, decoding=False)  # one budget, whatever the sources
        assert [d.manifest.num_samples for d in job.datasets] == [48, 16]


@pytest.fixture(scope="module")
def tar_sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("mix_tar")
    a, b = str(root / "a"), str(root / "b")
    write_tar_dataset(Store(a), TAR_SIZES)
    write_tar_dataset(Store(b), [6, 0, 9])
    return a, b


def raw_summaries(urls: list, epochs: int = 2, **options) -> list[list[tuple]]:
    with make_loader(urls, rank=0, world_size=1, decode=None, seed=5, **options) as loader:
        out = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            out.append([batch_summary(b) for b in loader])
        assert (loader.execution.stream == "raw") == ("transform" not in options)
    return out


@pytest.mark.parametrize("options", [
    dict(batch_size=4, shuffle_window=6, num_workers=0, tail="pad"),  # batches straddle windows
    dict(batch_size=5, shuffle_window=64, num_workers=0, tail="drop", epoch_samples=50),
    dict(batch_size=4, shuffle_window=6, num_workers=2, worker_mode="threads", tail="pad"),
    dict(batch_size=3, shuffle_window=5, num_workers=2, worker_mode="processes", tail="pad"),
])
def test_raw_tar_mixture_takes_the_fast_path_with_the_general_paths_batches(tar_sources, options) -> None:
    """RAW over tar sources reads windows into buffers (stream/raw.py) as for one dataset: the same
    batches as the general path (sample dicts), the source index and positions included."""
    a, b = tar_sources
    urls = [Source(a, weight=3.0), Source(b, repeat=2.0)]  # b upsampled: two passes an epoch
    fast = raw_summaries(urls, **options)
    general = raw_summaries(urls, transform=lambda sample: sample, **options)  # a hook: sample dicts
    assert fast == general
    sources = [s for batch in fast[0] for name, value in batch[2] if name == "source"
               for s in np.frombuffer(value[2], dtype=np.int64).tolist()]
    assert set(sources) == {0, 1}


def named_tar(root, name: str, sizes: list[int], names: tuple[str, ...], *, bad: dict[int, int] | None = None) -> str:
    """A tar dataset whose manifest names its labels; sample i has label i % len(names), or bad[i]."""
    from tests.dataio.shardgen import make_samples, write_tar_samples

    store = Store(str(root / name))
    shards = make_samples(sizes, num_classes=len(names))
    for s in (s for shard in shards for s in shard):
        s["cls"] = (bad or {}).get(s["__id__"], s["cls"])
    write_manifest(store, dataclasses.replace(write_tar_samples(store, shards), label_names=names))
    return store.url


def labels_by_source(loader) -> dict[tuple[int, str], int]:
    return {(s, k): y for b in loader for s, k, y, m in zip(b["source"].tolist(), b["__key__"], b["label"].tolist(),
                                                            b["mask"].tolist()) if m}


def test_labels_are_checked_against_each_sources_own_names(tmp_path) -> None:
    """A source may name more classes than another (one space, the longest names); a label its own
    manifest does not name is refused naming that source, its shard and the sample."""
    a = named_tar(tmp_path, "a", [6, 6], ("a", "b", "c"))
    b = named_tar(tmp_path, "b", [10], ("a", "b", "c", "d", "e"))
    with make_loader([a, b], batch_size=4, num_workers=0, decode=None) as loader:
        assert loader.label_names == ("a", "b", "c", "d", "e")
        got = labels_by_source(loader)
    assert got == {(s, k): int(k) % (3, 5)[s] for s, k in got} and {y for (s, _), y in got.items() if s == 1} == {
        0, 1, 2, 3, 4}
    bad = named_tar(tmp_path, "bad", [10], ("a", "b", "c", "d", "e"), bad={7: 7})
    with make_loader([a, bad], batch_size=4, num_workers=0, decode=None) as loader:
        with pytest.raises(CorruptSampleError, match=r"bad/shards/shard-000000.tar: sample '000007' of source 2 "
                                                     r"\(.*bad\) has label 7, but its manifest names 5 labels"):
            list(loader)


def test_label_names_that_differ_are_refused_naming_both_sets(tmp_path) -> None:
    a = named_tar(tmp_path, "a", [6], ("bird", "cat", "dog"))
    b = named_tar(tmp_path, "b", [6], ("ant", "bee", "cow"))
    with pytest.raises(ManifestError, match=r"a names \[bird, cat, dog\] and .*b names \[ant, bee, cow\].*"
                                            r"label_space='union'.*--label-map"):
        make_loader([a, b], batch_size=4, num_workers=0, decode=None)


@pytest.mark.parametrize("worker_mode", ["threads", "processes"])  # RAW batches, and sample dicts
def test_union_label_space_remaps_each_source_by_name(tmp_path, worker_mode) -> None:
    a = named_tar(tmp_path, "a", [6, 5], ("bird", "cat", "dog"))
    b = named_tar(tmp_path, "b", [9], ("eel", "cat", "ant"))
    options = dict(batch_size=4, num_workers=1, decode=None, worker_mode=worker_mode, tail="pad")
    with make_loader([a, b], label_space="union", **options) as loader:
        assert loader.label_names == ("ant", "bird", "cat", "dog", "eel")
        got = labels_by_source(loader)
    space = loader.label_names
    own = (("bird", "cat", "dog"), ("eel", "cat", "ant"))
    assert {s for s, _ in got} == {0, 1} and all(space[y] == own[s][int(k) % 3] for (s, k), y in got.items())
    by_map = {"a": {"bird": 0, "cat": 1, "dog": 2}, b: {"eel": 3, "cat": 1, "ant": 4}}
    with make_loader([a, b], label_space=by_map, **options) as loader:
        assert loader.label_names == ("bird", "cat", "dog", "eel", "ant")
        got = labels_by_source(loader)
    assert all(loader.label_names[y] == own[s][int(k) % 3] for (s, k), y in got.items())
    flat = {"eel": 2, "cat": 0, "ant": 1, "dog": 3}  # one map for every source (names it lacks allowed)
    with make_loader(b, label_space=flat, **options) as one:  # a mixture of one
        got = {k: y for batch in one for k, y in zip(batch["__key__"], batch["label"].tolist())}
    assert len(got) == 9 and all(y == flat[own[1][int(k) % 3]] for k, y in got.items())


def test_a_label_map_that_does_not_fit_is_refused(tmp_path) -> None:
    a = named_tar(tmp_path, "a", [6], ("bird", "cat", "dog"))
    b = named_tar(tmp_path, "b", [6], ("ant", "bee", "cow"))
    options = dict(batch_size=4, num_workers=0, decode=None)
    with pytest.raises(ManifestError, match=r"leaves out labels of .*b: \[cow\]"):
        make_loader([a, b], label_space={"a": {"bird": 0, "cat": 1, "dog": 2}, "b": {"ant": 0, "bee": 1}}, **options)
    with pytest.raises(ManifestError, match=r"key 'c' names no source; .* \['a', 'b'\]"):
        make_loader([a, b], label_space={"a": {"bird": 0}, "c": {"ant": 0}}, **options)
    with pytest.raises(ManifestError, match=r"no entry for \[.*b'\]"):
        make_loader([a, b], label_space={"a": {"bird": 0, "cat": 1, "dog": 2}}, **options)
    with pytest.raises(ValueError, match="label_space must be one of"):
        make_loader([a, b], label_space="by-index", **options)


def test_label_space_lookup_in_one_batch() -> None:
    """Pure: one lookup for all sources; -1 (no label) and padding pass; an unnamed source is mapped
    by its integer labels as keys, and one the map leaves out is refused."""
    from types import SimpleNamespace

    from dataio.loader.labels import SourceLabels, build_label_space

    def src(name, names):
        return SourceLabels(url=name, given=name, store=None, manifest=SimpleNamespace(label_names=names))

    space = build_label_space([src("x", ("b", "a")), src("y", None)], {"x": {"a": 0, "b": 1}, "y": {"0": 2, "2": 0}})
    assert space.names == ("a", "b", "0")
    batch = {"label": torch.tensor([0, 1, -1, 0, 2, 9]), "source": torch.tensor([0, 0, 0, 1, 1, 1]),
             "mask": torch.tensor([True] * 5 + [False]), "__key__": list("uvwxyz")}
    assert space.apply(dict(batch))["label"].tolist()[:5] == [1, 0, -1, 2, 0]
    with pytest.raises(CorruptSampleError, match=r"y: sample 'y' of source 2 \(y\) has label 1, but the label map"):
        space.apply({**batch, "label": torch.tensor([0, 1, -1, 0, 1, 0]), "mask": torch.ones(6, dtype=torch.bool)})


def test_one_dataset_is_a_mixture_of_one(dataset) -> None:
    """One URL: the single-dataset plan, batches and state (no 'source', no 'mixture'); given another
    epoch size it is resampled as a real mixture of one."""
    with make_loader(dataset, batch_size=4, num_workers=0, decode=None) as loader:
        assert loader.mixture.single and not loader.facts.mixed
        batch = next(iter(loader))
        assert "source" not in batch and "mixture" not in loader.state_dict()
    with make_loader(dataset, batch_size=4, num_workers=0, decode=None, epoch_samples=20) as loader:
        assert not loader.mixture.single and len(loader) == 5
        batches = list(loader)
        assert all(b["source"].tolist() == [0] * 4 for b in batches) and "mixture" in loader.state_dict()
