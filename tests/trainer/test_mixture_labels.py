"""The trainer's mixtures check what they mix before the first step: each source's labels against
its own manifest, label names that differ (refused, or one space by --label-space union /
--label-map), and sources whose fields differ (a folder of jpg/png/webp, a Hugging Face export)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dataio import ManifestError
from dataio.format.manifest import write_manifest
from dataio.storage.store import Store
from tests.dataio.mixed_images import mixed_images
from tests.dataio.shardgen import make_samples, write_tar_samples
from tests.sharding.conftest import run as shardify
from tests.sharding.test_real_sources import hf_parquet
from tests.trainer.harness import ok, run_here
from trainer import data
from trainer.flags import parse_config

pytestmark = pytest.mark.timeout(240)


def named_tar(root: Path, name: str, sizes: list[int], names: tuple[str, ...], *,
              bad: dict[int, int] | None = None) -> str:
    """A tar dataset of real images whose manifest names its labels; sample i has label
    i % len(names), or bad[i]."""
    store = Store(str(root / name))
    shards = make_samples(sizes, num_classes=len(names), real_images=True)
    for sample in (s for shard in shards for s in shard):
        sample["cls"] = (bad or {}).get(sample["__id__"], sample["cls"])
    write_manifest(store, dataclasses.replace(write_tar_samples(store, shards), label_names=names))
    return store.url


def flags(*data: str, out: Path, extra: tuple[str, ...] = ()) -> list[str]:
    args = [a for url in data for a in ("--data", url)]
    return [*args, "--model", "mlp", "--image-size", "8", "--no-augment", "--batch-size", "4", "--num-workers", "0",
            "--epochs", "1", "--log-every", "2", "--out", str(out), "--resume", "none", "--no-live", "--device", "cpu",
            "--dist-timeout-s", "60", *extra]


@pytest.mark.slow  # trains in this process: seconds
def test_labels_beyond_one_sources_classes_within_its_own_train_and_a_label_outside_is_refused(tmp_path, capsys):
    a = named_tar(tmp_path, "a", [12, 12], ("a", "b", "c"))
    b = named_tar(tmp_path, "b", [16], ("a", "b", "c", "d", "e"))  # names a's 3 classes and 2 more
    result = ok(run_here(flags(f"{a}=0.5", f"{b}=0.5", out=tmp_path / "run"), capsys))
    assert "trainer: error" not in result.stderr
    config = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert config["world_size"] == 1
    bad = named_tar(tmp_path, "bad", [16], ("a", "b", "c", "d", "e"), bad={9: 7})
    result = run_here(flags(f"{a}=0.5", f"{bad}=0.5", out=tmp_path / "bad_run"), capsys)
    assert result.returncode == 2, result.stderr[-3000:]  # the trainer's own exit code for bad data
    assert "bad/shards/shard-000000.tar: sample '000009' of source 2" in result.stderr
    assert "has label 7, but its manifest names 5 labels" in result.stderr


@pytest.mark.slow  # trains in this process: seconds
def test_label_names_that_differ_are_refused_naming_both_sets(tmp_path, capsys):
    a = named_tar(tmp_path, "a", [8], ("bird", "cat", "dog"))
    b = named_tar(tmp_path, "b", [8], ("ant", "bee", "cow"))
    result = run_here(flags(a, b, out=tmp_path / "run"), capsys)
    assert result.returncode == 2
    assert "names [bird, cat, dog] and" in result.stderr and "names [ant, bee, cow]" in result.stderr
    assert "--label-space union" in result.stderr and "--label-map" in result.stderr


@pytest.mark.slow  # trains in this process: seconds
def test_union_label_space_trains_and_remaps_each_sources_labels(tmp_path, capsys):
    a = named_tar(tmp_path, "a", [12, 12], ("bird", "cat", "dog"))
    b = named_tar(tmp_path, "b", [24], ("eel", "cat", "ant"))
    own = {0: ("bird", "cat", "dog"), 1: ("eel", "cat", "ant")}
    label_map = tmp_path / "labels.json"
    label_map.write_text(json.dumps({"a": {"bird": 0, "cat": 1, "dog": 2}, "b": {"eel": 3, "cat": 1, "ant": 4}}))
    for extra, space in ((("--label-space", "union"), ("ant", "bird", "cat", "dog", "eel")),
                         (("--label-map", str(label_map)), ("bird", "cat", "dog", "eel", "ant"))):
        cfg = parse_config(flags(a, b, out=tmp_path / "in_process", extra=extra))
        loader = data.open_loader(cfg, cfg.data, rank=0, world_size=1, train=True)
        try:
            assert loader.label_names == space and data.num_classes_of(cfg, loader) == 5
            got = [(s, k, y) for batch in loader
                   for s, k, y in zip(batch["source"].tolist(), batch["__key__"], batch["label"].tolist())]
        finally:
            data.close(loader)
        assert {s for s, _, _ in got} == {0, 1} and all(space[y] == own[s][int(k) % 3] for s, k, y in got)
    ok(run_here(flags(a, b, out=tmp_path / "run", extra=("--label-space", "union", "--val-data", a)), capsys))
    bad = parse_config(flags(a, b, out=tmp_path / "x", extra=("--label-map", str(tmp_path / "missing.json"))))
    with pytest.raises(ValueError, match=r"--label-map .*missing.json: cannot read it"):
        data.open_loader(bad, bad.data, rank=0, world_size=1, train=True)


@pytest.mark.slow  # trains in this process: seconds
def test_a_folder_of_jpg_png_webp_mixes_with_a_hugging_face_export(tmp_path, capsys):
    """The folder's samples hold jpg, png or webp and its manifest no caption; the export (`shardify
    index` of what `datasets` writes) one `image` column of {bytes, path} and a caption."""
    images, names = mixed_images(), ("jpeg_rgb", "png_rgb", "webp")
    for name in names:
        ext, blob = images[name][0], images[name][1]
        (tmp_path / "folder" / name).mkdir(parents=True)
        for i in range(8):
            (tmp_path / "folder" / name / f"{name}_{i}.{ext}").write_bytes(blob)
    assert shardify("write", tmp_path / "folder", tmp_path / "photos", "--workers", 1, "--quiet") == 0
    (tmp_path / "export").mkdir()
    hf_parquet(tmp_path / "export" / "train-00000-of-00001.parquet", ["png_rgba", "webp", "jpeg_rgb"] * 8,
               label_names=names)
    assert shardify("index", tmp_path / "export") == 0
    result = ok(run_here(flags(str(tmp_path / "photos") + "=0.5", str(tmp_path / "export") + "=0.5",
                               out=tmp_path / "run"), capsys))
    assert "trainer: error" not in result.stderr
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    summary = next(x for x in lines if x["kind"] == "summary")
    assert [s["samples"] > 0 for s in summary["sources"]] == [True, True]


def tar_without(root: Path, name: str, field: str) -> str:
    """A tar dataset of real images whose samples and manifest lack `field`."""
    store = Store(str(root / name))
    kept = tuple(f for f in ("jpg", "cls", "json") if f != field)
    manifest = write_tar_samples(store, make_samples([8], real_images=True), fields=kept)
    write_manifest(store, dataclasses.replace(manifest, fields=tuple(f for f in manifest.fields if f.name != field)))
    return store.url


def test_a_source_without_what_the_trainer_needs_is_refused_naming_it(tmp_path):
    a = named_tar(tmp_path, "a", [8], ("a", "b", "c"))
    cfg = parse_config(flags(a, tar_without(tmp_path, "unlabelled", "cls"), out=tmp_path / "run"))
    with pytest.raises(ValueError, match=r"unlabelled: this dataset has no label field .* every --data source"):
        data.open_loader(cfg, cfg.data, rank=0, world_size=1, train=True)
    cfg = parse_config(flags(a, tar_without(tmp_path, "imageless", "jpg"), out=tmp_path / "run"))
    with pytest.raises(ManifestError, match=r"imageless: this source has no image field "
                                            r"\(its fields: \['cls', 'json'\]"):
        data.open_loader(cfg, cfg.data, rank=0, world_size=1, train=True)
