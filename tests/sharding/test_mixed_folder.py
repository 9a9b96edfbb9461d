"""A real, messy image folder end to end: every format and colour mode -> `shardify write` (tar and
Parquet) -> `shardify verify` -> make_loader (CPU decode, DALI, raw) with the right pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dataio import make_loader
from dataio.format.manifest import read_manifest
from dataio.storage.store import Store
from tests.dataio.mixed_images import mixed_images, write_mixed_folder
from tests.sharding.conftest import run

pytestmark = pytest.mark.timeout(180)
TOLERANCE = {name: tol for name, (_, _, _, tol) in mixed_images().items()}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[int, int, int]]]:
    root = tmp_path_factory.mktemp("mixed") / "images"
    return root, write_mixed_folder(root)


def decoded_colours(url: str, **kw) -> tuple[dict[str, list[int]], dict[str, int]]:
    """key -> mean RGB of its decoded image, key -> label, over one eval epoch."""
    colours, labels = {}, {}
    with make_loader(url, batch_size=4, image_size=8, train=False, tail="pad", num_workers=1, **kw) as loader:
        for batch in loader:
            for key, image, label, real in zip(batch["__key__"], batch["image"].cpu(), batch["label"], batch["mask"]):
                if real:
                    colours[key] = np.asarray(image, dtype=np.float64).reshape(3, -1).mean(1).round().astype(int).tolist()
                    labels[key] = int(label)
    return colours, labels


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_mixed_folder_writes_verifies_and_loads_with_the_right_pixels(mixed, tmp_path, fmt) -> None:
    root, expected = mixed
    dest = tmp_path / "ds"
    assert run("write", root, dest, "--format", fmt, "--workers", 1, "--quiet", "--key", "path") == 0
    assert run("verify", dest, "--workers", 1, "--quiet") == 0
    m = read_manifest(Store(str(dest)))
    assert m.num_samples == len(expected)
    assert {f.name for f in m.fields if f.type == "image"} == {"jpg", "png", "webp", "bmp", "ppm", "pgm", "tif", "gif"}
    colours, labels = decoded_colours(str(dest))
    assert len(colours) == len(expected)
    classes = sorted({rel.split("/")[0] for rel in expected})
    for rel, colour in expected.items():
        key = rel.rsplit(".", 1)[0]  # --key path: the relative path without its extension
        name = rel.split("/")[0]
        assert max(abs(a - b) for a, b in zip(colours[key], colour)) <= TOLERANCE[name], (rel, colours[key], colour)
        assert labels[key] == classes.index(name)


def test_dali_matches_the_cpu_path_and_falls_back_per_sample(mixed, tmp_path) -> None:
    pytest.importorskip("nvidia.dali")
    root, expected = mixed
    dest = tmp_path / "ds"
    assert run("write", root, dest, "--workers", 1, "--quiet", "--key", "path") == 0
    cpu, _ = decoded_colours(str(dest))
    with make_loader(str(dest), batch_size=4, image_size=8, train=False, tail="pad", num_workers=1,
                     decode="dali") as loader:
        dali = {}
        for batch in loader:
            for key, image, real in zip(batch["__key__"], batch["image"].cpu(), batch["mask"]):
                if real:
                    dali[key] = np.asarray(image, dtype=np.float64).reshape(3, -1).mean(1).round().astype(int).tolist()
        # alpha, palettes, 16-bit, CMYK, GIF and TIFF go to the CPU path, sample by sample
        assert loader._decoder.num_cpu_samples >= 2 * 9
    assert dali.keys() == cpu.keys()
    for key in cpu:
        assert max(abs(a - b) for a, b in zip(dali[key], cpu[key])) <= 3, (key, dali[key], cpu[key])
