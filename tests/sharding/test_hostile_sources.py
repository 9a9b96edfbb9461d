"""Sloppy and hostile sources: mixed label columns, symlink loops, duplicate keys from re-sharding.

Before: one non-integer value in a label column silently renumbered every integer label; a
symlink loop turned 2 images into 82 samples and two crossing loops hung `write`; tars of the
same name in two directories were read as one (or their equal keys written twice) so `verify`
failed.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from dataio.format.manifest import read_manifest
from dataio.storage.store import Store
from sharding.sources.base import SourceError
from sharding.sources.labels import read_label_names, to_labels
from tests.sharding.conftest import make_image_folder, run


def _labels_of(dest: Path) -> dict[str, int]:
    """key -> label of a tar dataset."""
    out = {}
    m = read_manifest(Store(str(dest)))
    for p in m.shard_paths:
        with tarfile.open(dest / p) as tar:
            for member in tar:
                if member.name.endswith(".cls"):
                    out[member.name[: -len(".cls")]] = int(tar.extractfile(member).read())
    return out


def _table(tmp_path: Path, image_folder: Path, labels: list[str]) -> Path:
    files = sorted(p for p in image_folder.rglob("*.jpg"))[: len(labels)]
    path = tmp_path / "t.csv"
    path.write_text("path,label\n" + "".join(f"{f},{lab}\n" for f, lab in zip(files, labels)))
    return path


def test_label_column_mixing_integers_and_names_is_refused_naming_the_row(image_folder: Path, tmp_path: Path,
                                                                         capsys) -> None:
    table = _table(tmp_path, image_folder, ["0", "2", "1", "2", "cat", "0"])
    assert run("write", table, tmp_path / "ds", "--quiet") == 2
    err = capsys.readouterr().err
    assert "row 4" in err and "'cat'" in err and "--label-names" in err
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_integer_labels_in_text_stay_integers(image_folder: Path, tmp_path: Path) -> None:
    table = tmp_path / "t.jsonl"
    files = sorted(image_folder.rglob("*.jpg"))[:3]
    table.write_text("".join(json.dumps({"path": str(f), "label": lab}) + "\n" for f, lab in zip(files, ["10", "2", "0"])))
    assert run("write", table, tmp_path / "ds", "--quiet") == 0
    assert sorted(_labels_of(tmp_path / "ds").values()) == [0, 2, 10]  # not ranks of sorted strings


def test_name_labels_keep_sorted_order_or_the_given_one(image_folder: Path, tmp_path: Path) -> None:
    table = _table(tmp_path, image_folder, ["dog", "cat", "emu", "cat"])
    assert run("write", table, tmp_path / "sorted", "--quiet") == 0
    assert read_manifest(Store(str(tmp_path / "sorted"))).label_names == ("cat", "dog", "emu")
    assert list(_labels_of(tmp_path / "sorted").values()) == [1, 0, 2, 0]
    (tmp_path / "names.txt").write_text("emu\ndog\ncat\n")
    for flag in ("emu,dog,cat", f"@{tmp_path / 'names.txt'}"):
        dest = tmp_path / f"given{len(flag)}"
        assert run("write", table, dest, "--label-names", flag, "--quiet") == 0
        assert read_manifest(Store(str(dest))).label_names == ("emu", "dog", "cat")
        assert list(_labels_of(dest).values()) == [1, 2, 0, 2]


def test_label_names_must_cover_every_name(image_folder: Path, tmp_path: Path, capsys) -> None:
    table = _table(tmp_path, image_folder, ["dog", "cat", "yak"])
    assert run("write", table, tmp_path / "ds", "--label-names", "cat,dog", "--quiet") == 2
    assert "row 2" in capsys.readouterr().err
    assert run("write", image_folder, tmp_path / "f", "--label-names", "cat,bee,ant", "--quiet") == 0
    assert read_manifest(Store(str(tmp_path / "f"))).label_names == ("cat", "bee", "ant")
    assert run("write", image_folder, tmp_path / "g", "--label-names", "cat,bee", "--quiet") == 2
    assert "'ant'" in capsys.readouterr().err


def test_label_helpers() -> None:
    assert to_labels([3, None, 1], "t", "label") == ([3, None, 1], None)
    with pytest.raises(SourceError, match=r"row 0: label 'x'"):
        to_labels(["x", 1, 2, 3], "t", "label")
    with pytest.raises(SourceError, match="negative"):
        to_labels([1, -1], "t", "label")
    assert read_label_names(" a, b ,c") == ("a", "b", "c")
    with pytest.raises(ValueError, match="more than once"):
        read_label_names("a,b,a")


# --- symlinks ------------------------------------------------------------------------------------


@pytest.fixture
def looped(tmp_path: Path) -> Path:
    """2 images per class; a loop onto itself and two crossing loops (a -> b, b -> a)."""
    root = make_image_folder(tmp_path / "looped", per_class=2, classes=("a", "b"))
    os.symlink("..", root / "a" / "up")                 # a/up -> ROOT: the whole tree again
    os.symlink(root / "b", root / "a" / "to_b")          # crossing loops
    os.symlink(root / "a", root / "b" / "to_a")
    os.symlink(".", root / "b" / "self")                 # b/self -> b
    return root


@pytest.mark.timeout(60)
def test_symlink_loops_are_followed_once(looped: Path, tmp_path: Path) -> None:
    assert run("write", looped, tmp_path / "ds", "--quiet") == 0
    m = read_manifest(Store(str(tmp_path / "ds")))
    assert m.num_samples == 4  # each real file once
    assert sorted(_labels_of(tmp_path / "ds").values()) == [0, 0, 1, 1]


@pytest.mark.timeout(60)
def test_symlinked_directories_are_skipped_when_asked(looped: Path, tmp_path: Path) -> None:
    extra = make_image_folder(tmp_path / "elsewhere", per_class=3, classes=("c",))
    os.symlink(extra / "c", looped / "a" / "more")
    assert run("write", looped, tmp_path / "follow", "--quiet") == 0
    assert read_manifest(Store(str(tmp_path / "follow"))).num_samples == 7
    assert run("write", looped, tmp_path / "nofollow", "--no-follow-symlinks", "--quiet") == 0
    assert read_manifest(Store(str(tmp_path / "nofollow"))).num_samples == 4


# --- duplicate keys when re-sharding -------------------------------------------------------------


def _tar(path: Path, samples: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in samples.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _jpeg(seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (seed * 40 % 256, 0, 0)).save(buf, "JPEG")
    return buf.getvalue()


def test_same_named_tars_in_two_directories_get_unique_keys(tmp_path: Path) -> None:
    for d in ("a", "b"):
        _tar(tmp_path / d / "shard-000000.tar",
             {f"{i:06d}.{ext}": (_jpeg(i + len(d)) if ext == "jpg" else str(i).encode())
              for i in range(3) for ext in ("jpg", "cls")})
    dest = tmp_path / "ds"
    assert run("write", f"{tmp_path}/{{a,b}}/shard-000000.tar", dest, "--quiet") == 0
    labels = _labels_of(dest)
    assert len(labels) == 6 and "a/shard-000000/000001" in labels and "b/shard-000000/000001" in labels
    assert run("verify", dest, "--quiet") == 0


def test_keys_equal_but_for_their_directory_inside_a_tar_stay_apart(tmp_path: Path) -> None:
    _tar(tmp_path / "src" / "x.tar", {"left/000001.jpg": _jpeg(1), "right/000001.jpg": _jpeg(2)})
    assert run("write", tmp_path / "src" / "x.tar", tmp_path / "ds", "--quiet") == 0
    assert read_manifest(Store(str(tmp_path / "ds"))).num_samples == 2
    assert run("verify", tmp_path / "ds", "--quiet") == 0
