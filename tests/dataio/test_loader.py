"""The torch-facing loader in one process: batch contract, exactly once per (rank, worker), state."""

from __future__ import annotations

import json
import os

import pytest
import torch

from dataio import (
    CorruptSampleError,
    LoaderConfig,
    ManifestError,
    ShardFormatError,
    ShardLoader,
    StorageError,
    make_loader,
)
from dataio.batch import PackedBytes
from dataio.format.manifest import read_manifest
from dataio.loader.startup import ShardCheck
from dataio.plan.types import Topology
from dataio.storage.store import Store
from tests.dataio.loader_helpers import ALL_KEYS, SIZES, TOTAL, real_keys, run_epoch
from tests.dataio.shardgen import write_parquet_dataset, write_tar_dataset


# --- the batch contract ---------------------------------------------------------------------


def test_raw_batches_follow_the_contract(tmp_path) -> None:
    store = Store(str(tmp_path / "ds"))
    _, shards = write_tar_dataset(store, SIZES)
    by_key = {s["__key__"]: s for shard in shards for s in shard}
    batches, steps = run_epoch(store.raw_url, batch_size=4, num_workers=0, decode=None)
    assert steps == len(batches) == TOTAL // 4
    for number, batch in enumerate(batches):
        keys = batch["__key__"]
        assert isinstance(keys, list) and len(keys) == 4
        assert batch["label"].dtype == torch.int64
        assert batch["label"].tolist() == [int(by_key[k]["cls"]) for k in keys]
        assert isinstance(batch["jpg"], PackedBytes) and batch["jpg"].to_list() == [by_key[k]["jpg"] for k in keys]
        assert batch["json"] == [json.loads(by_key[k]["json"]) for k in keys]  # parsed, a list
        assert batch["mask"].dtype == torch.bool and batch["mask"].all()
        assert batch["read_s"] >= 0 and batch["decode_s"] == 0
        assert batch["batch_number"] == number


def test_decoded_batches_are_uint8_images(dataset) -> None:
    batches, _ = run_epoch(dataset, batch_size=3, num_workers=1, image_size=8)
    assert batches
    for batch in batches:
        assert batch["image"].shape == (3, 3, 8, 8) and batch["image"].dtype == torch.uint8
        assert "jpg" not in batch and isinstance(batch["json"], list) and isinstance(batch["json"][0], dict)
        assert batch["decode_s"] > 0


def test_field_projection_keeps_the_label(dataset) -> None:
    batches, _ = run_epoch(dataset, batch_size=4, num_workers=0, decode=None, fields=("json",))
    assert set(batches[0]) == {"__key__", "label", "json", "mask", "read_s", "decode_s", "batch_number",
                               "__shard__", "__position__"}
    assert batches[0]["label"].tolist() == [int(k) % 10 for k in batches[0]["__key__"]]


def test_dali_decode_hook(dataset) -> None:
    pytest.importorskip("nvidia.dali")
    dali, _ = run_epoch(dataset, batch_size=4, num_workers=1, image_size=8, decode="dali")
    cpu, _ = run_epoch(dataset, batch_size=4, num_workers=1, image_size=8, decode="cpu")
    assert [b["__key__"] for b in dali] == [b["__key__"] for b in cpu]
    for batch in dali:
        assert batch["image"].shape == (4, 3, 8, 8) and batch["image"].dtype == torch.uint8
        assert "jpg" not in batch and "__id__" not in batch and batch["mask"].all()


def test_parquet_dataset_raw(tmp_path) -> None:
    store = Store(str(tmp_path / "pq"))
    write_parquet_dataset(store, [5, 9, 2], row_group_size=3)
    batches, _ = run_epoch(store.raw_url, batch_size=4, num_workers=0, decode=None, tail="pad")
    assert sorted(real_keys(batches)) == [f"{i:06d}" for i in range(16)]
    for batch in batches:
        assert batch["label"].tolist() == [int(k) % 10 for k in batch["__key__"]]
        assert json.loads(batch["json"][0])["i"] == int(batch["__key__"][0])


def test_pad_tail_delivers_everything_and_masks_the_repeats(dataset) -> None:
    per_rank = [run_epoch(dataset, batch_size=5, num_workers=0, decode=None, tail="pad", rank=r, world_size=2)[0]
                for r in range(2)]
    seen = [k for batches in per_rank for k in real_keys(batches)]
    assert sorted(seen) == sorted(ALL_KEYS)
    num_pad = sum(int((~b["mask"]).sum()) for batches in per_rank for b in batches)
    assert num_pad == 2 * 5 * len(per_rank[0]) - TOTAL > 0


def test_collate_hook_gets_the_sample_dicts(dataset) -> None:
    def collate(samples):
        return {"keys": [s["__key__"] for s in samples], "ids": [s["__id__"] for s in samples]}

    batches, _ = run_epoch(dataset, batch_size=4, num_workers=0, decode=None, collate=collate)
    for batch in batches:
        assert [int(k) for k in batch["keys"]] == batch["ids"]
        assert set(batch) == {"keys", "ids", "mask", "read_s", "decode_s", "batch_number"}

    def stack(samples):  # decode="cpu": each sample arrives with its decoded (3, H, W) image
        return {"x": torch.stack([s["image"] for s in samples]), "n": len(samples)}

    batches, _ = run_epoch(dataset, batch_size=4, num_workers=0, image_size=8, collate=stack)
    assert all(b["x"].shape == (4, 3, 8, 8) and b["decode_s"] > 0 for b in batches)


def test_transform_hooks(dataset) -> None:
    batches, _ = run_epoch(dataset, batch_size=4, num_workers=0, image_size=8, transform=lambda t: t.fill_(7))
    assert all(bool((b["image"] == 7).all()) for b in batches)
    batches, _ = run_epoch(dataset, batch_size=4, num_workers=0, decode=None,
                           transform=lambda s: {**s, "json": b"{}"})
    assert all(b["json"] == [{}] * 4 for b in batches)  # the hook sees bytes; the batch gets parsed JSON


# --- exactly once, equal steps ----------------------------------------------------------------


@pytest.mark.parametrize("world_size,num_workers,batch_size,tail", [
    (1, 0, 4, "drop"), (2, 2, 3, "drop"), (3, 1, 5, "pad"), (4, 0, 2, "drop"), (4, 1, 20, "drop"),
])
def test_epoch_is_exactly_once_over_every_rank_and_worker(dataset, world_size, num_workers, batch_size, tail) -> None:
    per_rank = {}
    for rank in range(world_size):
        batches, steps = run_epoch(dataset, batch_size=batch_size, num_workers=num_workers, decode=None,
                                   tail=tail, rank=rank, world_size=world_size, shuffle_window=6)
        assert steps == len(batches)
        per_rank[rank] = batches
    seen = [k for batches in per_rank.values() for k in real_keys(batches)]
    assert len(seen) == len(set(seen))  # nothing twice
    assert TOTAL - len(seen) < (world_size * batch_size if tail == "drop" else 1)
    assert len({len(b) for b in per_rank.values()}) == 1  # equal steps: DDP cannot hang


def test_disk_cache(dataset, tmp_path) -> None:
    options = dict(batch_size=4, num_workers=1, decode=None, cache_dir=str(tmp_path / "cache"),
                   cache_limit_bytes=1 << 20)
    first, _ = run_epoch(dataset, **options)
    second, _ = run_epoch(dataset, **options)  # served from the cache
    assert [b["jpg"].to_list() for b in first] == [b["jpg"].to_list() for b in second]
    assert any(files for _, _, files in os.walk(tmp_path / "cache"))


def test_spawn_start_method(dataset) -> None:
    batches, _ = run_epoch(dataset, batch_size=4, num_workers=1, decode=None, tail="pad",
                           multiprocessing_context="spawn")
    assert sorted(real_keys(batches)) == sorted(ALL_KEYS)


def test_epochs_reshuffle_and_repeat(dataset) -> None:
    with make_loader(dataset, batch_size=4, num_workers=2, decode=None, tail="pad") as loader:
        first = real_keys(list(loader))
        again = real_keys(list(loader))  # no set_epoch: the same epoch again, like DistributedSampler
        loader.set_epoch(1)
        second = real_keys(list(loader))
        assert loader.state_dict()["epoch"] == 1
    assert first == again and sorted(first) == sorted(second) and first != second


# --- corrupt samples --------------------------------------------------------------------------


def test_corrupt_sample_raises_naming_url_and_key(corrupt_dataset) -> None:
    url, bad_key = corrupt_dataset
    with make_loader(url, batch_size=4, num_workers=1, image_size=8) as loader:
        with pytest.raises(CorruptSampleError, match=f"shard-000001.tar.*{bad_key}") as info:
            list(loader)
    # The advice is the loader's own switch (a loader user has no --on-error flag to pass).
    assert "on_corrupt='skip'" in str(info.value)


def test_corrupt_sample_skipped_keeps_equal_steps(corrupt_dataset) -> None:
    url, bad_key = corrupt_dataset
    with make_loader(url, batch_size=4, num_workers=1, image_size=8, tail="pad", on_corrupt="skip") as loader:
        steps = len(loader)
        batches = list(loader)
        assert len(batches) == steps == 3
        assert loader.stats.corrupt_skipped == 1
        assert loader.stats.corrupt_keys[0].endswith(f"shard-000001.tar#{bad_key}")
    assert sorted(real_keys(batches)) == sorted(f"{i:06d}" for i in range(11) if f"{i:06d}" != bad_key)


def test_corrupt_sample_skipped_by_dali_names_its_shard(corrupt_dataset) -> None:
    pytest.importorskip("nvidia.dali")
    url, bad_key = corrupt_dataset
    with make_loader(url, batch_size=4, num_workers=1, image_size=8, tail="pad", on_corrupt="skip",
                     decode="dali") as loader:
        batches = list(loader)
        assert loader.stats.corrupt_keys == [f"{url}/shards/shard-000001.tar#{bad_key}"]
    assert all("__url__" not in b and "__id__" not in b for b in batches)


# --- bad input and arguments ------------------------------------------------------------------


def test_missing_or_bad_manifest(tmp_path) -> None:
    with pytest.raises(ManifestError, match="manifest.json does not exist"):
        make_loader(str(tmp_path), batch_size=2)
    (tmp_path / "manifest.json").write_text(json.dumps({"shardify_manifest": 99}))
    with pytest.raises(ManifestError, match="version 99"):
        make_loader(str(tmp_path), batch_size=2)


def test_missing_shard(tmp_path) -> None:
    root = str(tmp_path / "ds")
    write_tar_dataset(Store(root), [3, 4])
    os.remove(os.path.join(root, "shards", "shard-000001.tar"))
    # The listing runs beside the first batches (never before the first): one batch may come from
    # shard 0, then the epoch fails naming the missing one, whichever of listing or read finds it.
    with make_loader(root, batch_size=2, decode=None, num_workers=0) as loader:
        with pytest.raises((ManifestError, StorageError), match="shard-000001.tar"):
            list(loader)
    store = Store(root)
    check = ShardCheck([(store, read_manifest(store))], enabled=True)
    check.poll()  # not started: nothing to say yet
    check.start()
    with pytest.raises(ManifestError, match="1 file.*missing.*shard-000001.tar"):
        check.finish()
    check.start()  # a failed check lists again (the next iteration's first batch)
    with pytest.raises(ManifestError, match="shard-000001.tar"):
        check.finish()
    ShardCheck([(store, read_manifest(store))], enabled=False).finish()  # check_shards=False
    with make_loader(root, batch_size=2, decode=None, num_workers=0, check_shards=False) as loader:
        with pytest.raises(StorageError, match="shard-000001.tar"):
            list(loader)


def test_damaged_index_fails_with_its_url(tmp_path) -> None:
    root = str(tmp_path / "ds")
    write_tar_dataset(Store(root), [3, 4])
    path = os.path.join(root, "shards", "shard-000001.tar.idx")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data.replace(b"jpg", b"JPG"))  # same size, other checksum
    with make_loader(root, batch_size=2, decode=None, num_workers=1) as loader:
        with pytest.raises(ShardFormatError, match="shard-000001.tar.idx: index checksum"):
            list(loader)


@pytest.mark.parametrize("options,error", [
    (dict(batch_size=0), ValueError),
    (dict(batch_size=2, tail="wrap"), ValueError),
    (dict(batch_size=2, decode="tpu"), ValueError),
    (dict(batch_size=2, on_corrupt="ignore"), ValueError),
    (dict(batch_size=2, cache_dir="/tmp/x"), ValueError),
    (dict(batch_size=2, fields="jpg"), TypeError),
    (dict(batch_size=2, transform=3), TypeError),
])
def test_bad_arguments(options, error) -> None:
    with pytest.raises(error):
        LoaderConfig.from_options(**options)


@pytest.mark.parametrize("topology", [dict(rank=1), dict(rank=2, world_size=2), dict(rank=0, world_size=0),
                                      dict(rank=None, world_size=None, num_workers=-1)])
def test_bad_topology_is_refused(topology) -> None:
    from dataio.loader.make import job_topology

    with pytest.raises(ValueError):
        job_topology(**{"rank": None, "world_size": None, "num_workers": 2, **topology})


def test_make_loader_takes_exactly_the_config_fields_with_the_same_defaults() -> None:
    import dataclasses
    import inspect

    params = inspect.signature(make_loader).parameters
    fields = {o.name: o.default for o in LoaderConfig.options()}
    # weights belong to the URLs (Source objects); rank, world_size and num_workers build the Topology
    assert list(params)[:5] == ["url", "weights", "rank", "world_size", "num_workers"]
    assert set(params) - {"url", "weights", "rank", "world_size", "num_workers"} == set(fields)
    assert not {"rank", "world_size", "num_workers"} & set(fields)
    assert all(params[name].default == default for name, default in fields.items() if name != "batch_size")
    assert params["batch_size"].default is inspect.Parameter.empty
    assert all(f"    {name}: " in make_loader.__doc__ for name in fields)  # the docstring lists every option


def test_the_config_is_grouped_by_concern_and_read_flat() -> None:
    """Nested frozen sub-configs; from_options puts each flat option in its group; every option is read
    by its flat name too; the flat view lists each once, with its default, type and help."""
    import dataclasses

    config = LoaderConfig.from_options(batch_size=3, decode=None, prefetch_bytes=1 << 20, seq_len=8,
                                       worker_mode="threads", label_space="union")
    assert (config.images.decode, config.reading.prefetch_bytes, config.tokens.seq_len) == (None, 1 << 20, 8)
    assert (config.workers.worker_mode, config.mixing.label_space, config.batch_size) == ("threads", "union", 3)
    assert (config.decode, config.prefetch_bytes, config.seq_len, config.worker_mode) == (None, 1 << 20, 8, "threads")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.images.decode = "cpu"  # type: ignore[misc]
    options = LoaderConfig.options()
    names = [o.name for o in options]
    assert len(names) == len(set(names)) == 39 and all(o.help and "\n" not in o.help for o in options)
    assert {o.group for o in options} == {"", "reading", "workers", "images", "tokens", "mixing"}
    by_name = {o.name: o for o in options}
    assert by_name["batch_size"].default is dataclasses.MISSING and by_name["image_size"].default == 224
    assert by_name["prefetch_bytes"].type == (int | None) and by_name["decode"].group == "images"
    defaults = LoaderConfig.from_options(batch_size=1)
    assert all(getattr(defaults, o.name) == o.default for o in options if o.name != "batch_size")
    with pytest.raises(TypeError, match="unknown loader option 'imagesize'; did you mean 'image_size'"):
        LoaderConfig.from_options(batch_size=1, imagesize=3)
    with pytest.raises(AttributeError, match="no option 'nope'"):
        _ = config.nope


def test_an_unknown_option_is_refused_naming_the_closest() -> None:
    with pytest.raises(TypeError, match="'shuffle_windw'.*did you mean 'shuffle_window'"):
        make_loader("/nowhere", batch_size=2, shuffle_windw=3)
    with pytest.raises(TypeError, match="did you mean 'num_workers'"):
        make_loader("/nowhere", batch_size=2, num_worker=3)


def test_topology_is_built_once_by_make_loader_and_passed_down(dataset) -> None:
    with make_loader(dataset, batch_size=2, num_workers=0, decode=None, rank=1, world_size=3) as loader:
        assert loader.topology == Topology(rank=1, world_size=3, num_workers=1)  # in-process: one plan worker
        assert (loader.rank, loader.world_size) == (1, 3)
    with make_loader(dataset, batch_size=2, num_workers=2, decode=None) as loader:  # no process group
        assert loader.topology == Topology(rank=0, world_size=1, num_workers=2)
    config = LoaderConfig.from_options(batch_size=2, decode=None)
    with pytest.raises(ValueError, match=r"in this process \(num_workers=0\) plans 1 worker"):
        ShardLoader(dataset, config, topology=Topology(rank=0, world_size=1, num_workers=2), num_workers=0)
    with ShardLoader(dataset, config, topology=Topology(rank=1, world_size=2, num_workers=2)) as loader:
        assert len(loader) == TOTAL // (2 * 2) and loader.num_workers == 2


def test_unknown_option_and_field(dataset) -> None:
    with pytest.raises(TypeError, match="batchsize"):
        make_loader(dataset, batch_size=2, batchsize=3)
    with pytest.raises(ValueError, match="png"):
        make_loader(dataset, batch_size=2, fields=("png",))


def test_a_token_dataset_without_seq_len_is_refused_up_front(tmp_path) -> None:
    from dataio.format.manifest import Manifest, checksum_bytes, write_manifest
    from dataio.format.token_layout import TokenizerInfo, TokensInfo

    tokenizer = TokenizerInfo(name="byte", kind="hf", vocab_size=256, eos_id=0)
    c = checksum_bytes(b"")  # the manifest alone is read: no shard is
    manifest = Manifest(format="tokens", fields=(), shard_paths=("shards/shard-000000.tokens",), shard_num_samples=(1,),
                        shard_num_bytes=(2,), shard_checksums=(c,), index_paths=("shards/shard-000000.idx",),
                        index_num_bytes=(16,), index_checksums=(c,), sums_checksums=(c,), shard_num_tokens=(1,),
                        tokens=TokensInfo(tokenizer=tokenizer, dtype="uint16"))
    write_manifest(Store(str(tmp_path)), manifest)
    with pytest.raises(ManifestError, match=f"{tmp_path}: a token dataset.*pass seq_len="):
        make_loader(str(tmp_path), batch_size=2)
