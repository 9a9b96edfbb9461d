"""The synthetic image folder: deterministic, ImageNet-like layout and sizes, valid JPEGs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from tools.make_synthetic import (
    SyntheticConfig,
    class_name,
    make_synthetic,
    render_jpeg,
)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_folder_layout_and_images(tmp_path):
    config = SyntheticConfig(num_images=12, num_classes=4, seed=3)
    num_bytes = make_synthetic(tmp_path, config, num_procs=1)
    files = _files(tmp_path)
    assert len(files) == 12 and sum(map(len, files.values())) == num_bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == [class_name(i) for i in range(4)]
    for rel, data in files.items():
        assert rel.endswith(".jpg") and not Path(rel).name.startswith(".")
        with Image.open(tmp_path / rel) as img:
            img.load()
            assert img.format == "JPEG" and img.mode == "RGB"
            assert 400 <= img.width <= 600 and 300 <= img.height <= 450
        assert 40_000 < len(data) < 250_000  # realistic JPEG sizes, not flat colour


def test_same_seed_same_bytes_whatever_the_processes(tmp_path):
    config = SyntheticConfig(num_images=20, num_classes=3, seed=7, width=64, height=48)
    make_synthetic(tmp_path / "a", config, num_procs=1)
    make_synthetic(tmp_path / "b", config, num_procs=2)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    other = SyntheticConfig(num_images=20, num_classes=3, seed=8, width=64, height=48)
    assert render_jpeg(config, 0) != render_jpeg(other, 0)


def test_bad_configs_are_refused():
    with pytest.raises(ValueError):
        SyntheticConfig(num_images=2, num_classes=5)
    with pytest.raises(ValueError):
        SyntheticConfig(num_images=0, num_classes=0)
    with pytest.raises(ValueError):
        SyntheticConfig(num_images=5, num_classes=1, quality=0)


@pytest.mark.slow  # runs the CLI in a new interpreter
def test_cli(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tools.make_synthetic", str(tmp_path), "--num-images", "3",
                          "--num-classes", "2", "--seed", "1"], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[2])
    assert "wrote 3 images in 2 classes" in out.stdout
    assert len(list(tmp_path.rglob("*.jpg"))) == 3
