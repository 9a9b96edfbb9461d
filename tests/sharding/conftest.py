"""Shared fixtures for the shardify tests: tiny image folders built with PIL, and the CLI run in-process."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest
from PIL import Image

from sharding.cli import main

CLASSES = ("ant", "bee", "cat")


def make_image_folder(root: Path, *, per_class: int = 8, classes: tuple[str, ...] = CLASSES, seed: int = 0,
                      size: int = 24) -> Path:
    """ROOT/CLASS/N.jpg|png: small, distinct, deterministic images (every third one a PNG)."""
    rng = random.Random(seed)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            img = Image.new("RGB", (size + i, size), tuple(rng.randrange(256) for _ in range(3)))
            img.putpixel((i, 0), (255, 0, 0))
            img.save(root / c / f"img{i}.{'png' if i % 3 == 0 else 'jpg'}")
    return root


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "images")


def run(*args: object) -> int:
    """Run `shardify ARGS` in this process and return its exit code."""
    return main([str(a) for a in args])


def manifest_of(dest: Path) -> dict:
    return json.loads((dest / "manifest.json").read_text())


def ctrl_c_reaches_it() -> None:
    """Popen preexec_fn: SIGINT at its default in the child, so Python turns it into KeyboardInterrupt
    as under a terminal. A shell runs background jobs with SIGINT ignored, and a child inherits that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
