"""The digits export: both splits, every class, deterministic, readable PNGs."""

from __future__ import annotations

import numpy as np
from PIL import Image

from tools.export_digits import DigitsExport, export_digits, split_indices


def test_export_is_complete_and_disjoint(tmp_path):
    counts = export_digits(tmp_path / "a", DigitsExport(size=16))
    assert counts["train"] + counts["val"] == 1797
    assert 0.15 < counts["val"] / 1797 < 0.25
    names = {}
    for split in ("train", "val"):
        assert sorted(p.name for p in (tmp_path / "a" / split).iterdir()) == [str(d) for d in range(10)]
        names[split] = {p.name for p in (tmp_path / "a" / split).rglob("*.png")}
        assert len(names[split]) == counts[split]
    assert not names["train"] & names["val"]
    with Image.open(next((tmp_path / "a" / "val" / "7").iterdir())) as img:
        assert img.size == (16, 16) and img.mode == "RGB"


def test_split_is_a_fixed_function_of_the_seed():
    labels = np.repeat(np.arange(10), 30)
    a = split_indices(len(labels), labels, DigitsExport(seed=0))
    assert np.array_equal(a, split_indices(len(labels), labels, DigitsExport(seed=0)))
    assert not np.array_equal(a, split_indices(len(labels), labels, DigitsExport(seed=1)))
    assert all(a[labels == d].sum() == 6 for d in range(10))  # every digit in val, 20% of each
