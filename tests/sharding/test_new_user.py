"""Data made elsewhere, as a new user brings it: each case once failed unclearly or silently.

Every refusal names the file (and row or sample key) and what to do, exits 2, and publishes no
manifest; whatever is written is complete.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import tarfile
import tempfile
from pathlib import Path

import pytest

from tests.sharding.conftest import make_image_folder, manifest_of, run


def _fails(capsys, *args: object, code: int = 2) -> str:
    assert run(*args) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def _jpeg(seed: int = 0) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 12), (seed * 40 % 256, 80, 160)).save(buf, format="JPEG")
    return buf.getvalue()


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def test_truncated_source_tar_is_named(tmp_path: Path, capsys) -> None:
    whole = _tar(tmp_path / "whole.tar", [(f"k{i}.{e}", d) for i in range(6) for e, d in (("jpg", _jpeg(i)), ("cls", b"1"))])
    cut = tmp_path / "cut-000000.tar"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2 + 100])
    err = _fails(capsys, "write", cut, tmp_path / "ds", "--quiet")
    assert "cut-000000.tar" in err and "truncated" in err  # was "tar: tar is truncated ..."
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_tar_sample_without_its_image_is_refused_or_skipped(tmp_path: Path, capsys) -> None:
    src = _tar(tmp_path / "src.tar", [("a.jpg", _jpeg(1)), ("a.cls", b"0"), ("lonely.cls", b"1"),
                                      ("b.jpg", _jpeg(2)), ("b.cls", b"1")])
    err = _fails(capsys, "write", src, tmp_path / "ds", "--quiet")
    assert "src.tar" in err and "'lonely'" in err and "no image" in err and "--on-error skip" in err
    assert not (tmp_path / "ds" / "manifest.json").exists()
    assert run("write", src, tmp_path / "ds2", "--quiet", "--on-error", "skip") == 0
    m = manifest_of(tmp_path / "ds2")
    assert m["num_samples"] == 2 and [s["key"] for s in m["skipped"]] == ["lonely"]


COMPRESSORS = {"tar.gz": gzip.compress, "tgz": gzip.compress, "tar.bz2": bz2.compress, "tar.xz": lzma.compress}


@pytest.mark.parametrize("ext", sorted(COMPRESSORS))
def test_compressed_tars_are_read_like_plain_ones(tmp_path: Path, ext: str, monkeypatch) -> None:
    # Compressed WebDataset shards (as webdataset itself reads them) were refused with "decompress
    # them first": they are decompressed to a temporary folder and read as the plain tars would be.
    # This test's own temporary folder: the other parameters run beside it on other processes.
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    shards = [[(f"s{j}k{i}.{e}", d) for i in range(3) for e, d in (("jpg", _jpeg(3 * j + i)), ("cls", b"%d" % j))]
              for j in range(2)]
    (tmp_path / "src").mkdir()
    for j, members in enumerate(shards):
        plain = _tar(tmp_path / f"plain-{j}.tar", members)
        (tmp_path / "src" / f"train-{j}.{ext}").write_bytes(COMPRESSORS[ext](plain.read_bytes()))
    assert run("write", tmp_path / "plain-{0..1}.tar", tmp_path / "want", "--quiet") == 0
    want = manifest_of(tmp_path / "want")
    for n, src in enumerate([tmp_path / "src", tmp_path / "src" / f"train-{{0..1}}.{ext}", tmp_path / "src" / f"train-1.{ext}"]):
        before = set(Path(tempfile.gettempdir()).glob("shardify-untar-*"))
        assert run("write", src, tmp_path / f"ds{n}", "--quiet") == 0
        m = manifest_of(tmp_path / f"ds{n}")
        expected = 6 if n < 2 else 3
        assert m["num_samples"] == expected and m["label_names"] == want["label_names"]
        if n < 2:
            assert m["shards"]["checksum"] == want["shards"]["checksum"]  # the same bytes
        assert set(Path(tempfile.gettempdir()).glob("shardify-untar-*")) <= before  # the copies are gone
    sources = json.loads(next((tmp_path / "ds0").rglob("*.sources.json")).read_text())
    assert f"train-0.{ext}#s0k0" in json.dumps(sources)  # provenance names the compressed file


def test_a_damaged_compressed_tar_is_named(tmp_path: Path, capsys) -> None:
    whole = _tar(tmp_path / "w.tar", [(f"k{i}.{e}", d) for i in range(4) for e, d in (("jpg", _jpeg(i)), ("cls", b"0"))])
    packed = gzip.compress(whole.read_bytes())
    (tmp_path / "cut.tar.gz").write_bytes(packed[: len(packed) // 2])
    err = _fails(capsys, "write", tmp_path / "cut.tar.gz", tmp_path / "ds", "--quiet")
    assert "cut.tar.gz" in err and "cannot decompress" in err and "download it again" in err
    assert not (tmp_path / "ds" / "manifest.json").exists()
    (tmp_path / "good.tar.gz").write_bytes(packed)
    capsys.readouterr()
    assert run("write", tmp_path / "good.tar.gz", tmp_path / "ok") == 0  # not --quiet: says what it does
    assert "decompressing 1 compressed tar shard(s)" in capsys.readouterr().err
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.tar.gz").write_bytes(packed)
    (tmp_path / "mixed" / "b.tar").write_bytes(whole.read_bytes())
    err = _fails(capsys, "write", tmp_path / "mixed", tmp_path / "ds", "--quiet")
    assert "mixes plain and compressed" in err and "b.tar" in err


def test_a_folder_with_tars_and_images_is_refused_not_half_read(tmp_path: Path, capsys) -> None:
    # The tars were read and the class folders beside them left out without a word.
    folder = make_image_folder(tmp_path / "src", per_class=2, classes=("a", "b"))
    _tar(folder / "extra.tar", [("k0.jpg", _jpeg()), ("k0.cls", b"0")])
    err = _fails(capsys, "write", folder, tmp_path / "ds", "--quiet")
    assert "extra.tar" in err and "image files too" in err and str(folder) in err
    assert not (tmp_path / "ds" / "manifest.json").exists()
    (folder / "extra.tar").rename(tmp_path / "extra.tar")
    assert run("write", folder, tmp_path / "ds", "--quiet") == 0  # the images alone
    assert manifest_of(tmp_path / "ds")["num_samples"] == 4


def test_tsv_table_with_paths_relative_to_its_folder(tmp_path: Path) -> None:
    folder = make_image_folder(tmp_path / "t" / "imgs", per_class=2, classes=("a",))
    rows = "".join(f"imgs/a/{p.name}\t{'x' if i else 'y'}\n" for i, p in enumerate(sorted((folder / "a").iterdir())))
    (tmp_path / "t" / "list.tsv").write_text("image\tlabel\n" + rows)
    assert run("write", tmp_path / "t" / "list.tsv", tmp_path / "ds", "--quiet") == 0
    m = manifest_of(tmp_path / "ds")
    assert m["num_samples"] == 2 and m["label_names"] == ["x", "y"]


def test_table_rows_with_an_empty_or_missing_image_name_the_row(tmp_path: Path, capsys) -> None:
    make_image_folder(tmp_path / "t" / "imgs", per_class=1, classes=("a",))
    (tmp_path / "t" / "t.csv").write_text("image,label\nimgs/a/img0.png,cat\n,dog\nimgs/nothere.jpg,cat\n")
    err = _fails(capsys, "write", tmp_path / "t" / "t.csv", tmp_path / "ds", "--quiet")
    assert "t.csv row 1" in err and "'image' is empty" in err  # was: "t/: cannot read (Is a directory)"
    assert run("write", tmp_path / "t" / "t.csv", tmp_path / "ds2", "--quiet", "--on-error", "skip") == 0
    reasons = [s["reason"] for s in manifest_of(tmp_path / "ds2")["skipped"]]
    assert "row 1" in reasons[0] and "row 2" in reasons[1] and "nothere.jpg" in reasons[1]


def test_destination_that_is_a_file(image_folder: Path, tmp_path: Path, capsys) -> None:
    dest = tmp_path / "afile"
    dest.write_text("mine")
    err = _fails(capsys, "write", image_folder, dest, "--quiet")
    assert str(dest) in err and "is a file" in err  # was "[Errno 20] Not a directory: .../versions"
    assert dest.read_text() == "mine"


def test_inspect_with_a_deleted_shard_names_it_and_fails(image_folder: Path, tmp_path: Path, capsys) -> None:
    dest = tmp_path / "ds"
    assert run("write", image_folder, dest, "--quiet", "--max-samples-per-shard", 8) == 0
    (dest / "shards" / "shard-000001.tar").unlink()
    capsys.readouterr()
    assert run("inspect", dest) == 1  # was a bare "[Errno 2] No such file or directory" with exit 2
    out = capsys.readouterr().out
    assert "shard-000001.tar" in out and "cannot read" in out and "shardify verify" in out
    assert "label histogram" in out


def test_tar_with_images_first_then_labels_regroups_by_key(tmp_path: Path) -> None:
    # `tar cf s.tar *.jpg *.cls`: a sample's members are not consecutive (was "key appears twice")
    members = [(f"k{i}.jpg", _jpeg(i)) for i in range(3)] + [(f"k{i}.cls", str(i).encode()) for i in range(3)]
    src = _tar(tmp_path / "split.tar", members)
    assert run("write", src, tmp_path / "ds", "--quiet") == 0
    with tarfile.open(tmp_path / "ds" / "shards" / "shard-000000.tar") as t:
        names = t.getnames()
        assert names == ["k0.jpg", "k0.cls", "k1.jpg", "k1.cls", "k2.jpg", "k2.cls"]
        assert [t.extractfile(f"k{i}.cls").read() for i in range(3)] == [b"0", b"1", b"2"]


def test_tar_key_with_the_same_extension_twice_is_refused(tmp_path: Path, capsys) -> None:
    src = _tar(tmp_path / "dup.tar", [("a.jpg", _jpeg(1)), ("a.cls", b"0"), ("b.jpg", _jpeg(2)), ("a.jpg", _jpeg(3))])
    err = _fails(capsys, "write", src, tmp_path / "ds", "--quiet")
    assert "dup.tar" in err and "'a'" in err and "two 'jpg' members" in err


def test_keys_with_dots_keep_their_label(tmp_path: Path) -> None:
    # WebDataset splits at the first dot: key `img`, members `v1.2.jpg` and `v1.2.cls` (label was lost: -1)
    src = _tar(tmp_path / "dots.tar", [("img.v1.2.jpg", _jpeg(1)), ("img.v1.2.cls", b" 3\n"),
                                       ("b.jpg", _jpeg(2)), ("b.cls", b"1")])
    assert run("write", src, tmp_path / "ds", "--quiet") == 0
    with tarfile.open(tmp_path / "ds" / "shards" / "shard-000000.tar") as t:
        assert t.getnames() == ["img.v1.2.jpg", "img.cls", "b.jpg", "b.cls"]
        assert t.extractfile("img.cls").read() == b"3"


def test_unlabeled_samples_are_said(tmp_path: Path, capsys) -> None:
    src = _tar(tmp_path / "some.tar", [("a.jpg", _jpeg(1)), ("a.cls", b"0"), ("b.jpg", _jpeg(2))])
    assert run("write", src, tmp_path / "ds", "--quiet") == 0
    out = capsys.readouterr().out
    assert "1 sample(s) have no label" in out and "'b'" in out and "-1" in out


def test_files_left_out_are_said_and_jfif_is_jpeg(tmp_path: Path, capsys) -> None:
    src = make_image_folder(tmp_path / "src", per_class=2, classes=("a", "b"))
    (src / "a" / "x.jfif").write_bytes(_jpeg(5))  # Windows' name for a JPEG: was silently left out
    for name in ("IMG_1.HEIC", "IMG_2.heic", "notes.txt", "Thumbs.db", ".DS_Store"):
        (src / "b" / name).write_bytes(b"\0" * 8)
    assert run("write", src, tmp_path / "ds", "--quiet", "--key", "path") == 0
    out = capsys.readouterr().out
    assert ".heic x2" in out and ".txt x1" in out and "Thumbs" not in out and "DS_Store" not in out
    with tarfile.open(tmp_path / "ds" / "shards" / "shard-000000.tar") as t:
        assert "a/x.jpg" in t.getnames()
    only = tmp_path / "heic" / "c"
    only.mkdir(parents=True)
    (only / "p.heic").write_bytes(b"\0" * 8)
    err = _fails(capsys, "write", tmp_path / "heic", tmp_path / "ds2", "--quiet")
    assert "hold no images" in err and ".heic x1" in err


def test_table_image_column_of_another_name_is_found_and_a_missing_label_said(tmp_path: Path, capsys) -> None:
    make_image_folder(tmp_path / "t" / "imgs", per_class=2, classes=("a",))
    (tmp_path / "t" / "list.csv").write_text("img_path,y\nimgs/a/img0.png,cat\nimgs/a/img1.jpg,dog\n")
    assert run("write", tmp_path / "t" / "list.csv", tmp_path / "ds", "--quiet") == 0  # images were left out
    out = capsys.readouterr().out
    assert "--label-column" in out and "'y'" in out
    with tarfile.open(tmp_path / "ds" / "shards" / "shard-000000.tar") as t:
        assert t.getnames() == ["000000.png", "000000.json", "000001.jpg", "000001.json"]


def test_deep_long_paths_give_keys_that_fit_a_tar_header(tmp_path: Path) -> None:
    from PIL import Image

    from sharding.sources.base import path_keys

    deep = tmp_path / "src" / "c" / "/".join(["d" * 60] * 4)  # --key path failed: "does not fit a ustar header"
    deep.mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(deep / ("x" * 150 + ".jpg"))
    Image.new("RGB", (8, 8)).save(deep / ("x" * 150 + ".png"))
    assert run("write", tmp_path / "src", tmp_path / "ds", "--quiet", "--key", "path") == 0
    with tarfile.open(tmp_path / "ds" / "shards" / "shard-000000.tar") as t:
        names = [n for n in t.getnames() if not n.endswith(".cls")]
    assert len(names) == 2 and len(set(names)) == 2
    assert run("verify", tmp_path / "ds") == 0
    keys = path_keys(["a/" + "y" * 200 + ".jpg", "a/" + "y" * 200 + ".png", "b/short.jpg"])
    assert keys[2] == "b/short" and len(set(keys)) == 3 and all(len(k.rsplit("/", 1)[-1]) <= 83 for k in keys)
    assert keys == path_keys(["a/" + "y" * 200 + ".jpg", "a/" + "y" * 200 + ".png", "b/short.jpg"])  # stable


def test_table_made_on_windows_with_bom_crlf_and_backslashes(tmp_path: Path) -> None:
    folder = make_image_folder(tmp_path / "t" / "imgs", per_class=2, classes=("a",))
    first = (folder / "a" / "img0.png").as_uri()
    text = f"\ufeffimage,label\r\nimgs\\a\\img1.jpg,cat\r\n{first},dog\r\n"  # was: "imgs\a\img1.jpg: cannot read"
    (tmp_path / "t" / "win.csv").write_bytes(text.encode("utf-8"))
    assert run("write", tmp_path / "t" / "win.csv", tmp_path / "ds", "--quiet") == 0
    m = manifest_of(tmp_path / "ds")
    assert m["num_samples"] == 2 and m["label_names"] == ["cat", "dog"]


def test_another_tools_manifest_json_does_not_make_a_folder_a_dataset(image_folder: Path, tmp_path: Path) -> None:
    (image_folder / "manifest.json").write_text('{"name": "my photos", "version": 2}')  # was "not a shardify manifest"
    assert run("write", image_folder, tmp_path / "ds", "--quiet") == 0
    assert manifest_of(tmp_path / "ds")["num_samples"] == 24
    assert run("write", tmp_path / "ds", tmp_path / "again", "--quiet") == 0  # a real dataset still re-shards
    assert manifest_of(tmp_path / "again")["num_samples"] == 24


def test_pandas_style_label_columns_nan_is_missing_and_fractions_are_refused(tmp_path: Path, capsys) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sharding.sources.labels import to_labels

    jpg = _jpeg(1)
    # pandas writes integer labels with a gap as float64 with NaN: was "mixes integer labels with other strings"
    pq.write_table(pa.table({"image": [jpg, jpg, jpg], "label": [0.0, float("nan"), 1.0]}), tmp_path / "t.parquet")
    assert run("write", tmp_path / "t.parquet", tmp_path / "ds", "--quiet") == 0
    assert "1 sample(s) have no label" in capsys.readouterr().out
    assert to_labels(["cat", float("nan"), "dog"], "t", "label") == ([0, None, 1], ("cat", "dog"))  # not a class 'nan'
    pq.write_table(pa.table({"image": [jpg, jpg], "label": [0.0, 1.5]}), tmp_path / "f.parquet")
    err = _fails(capsys, "write", tmp_path / "f.parquet", tmp_path / "ds2", "--quiet")
    assert "f.parquet row 1" in err and "1.5" in err and "not a whole number" in err


def test_an_empty_class_folder_is_said_and_keeps_its_number(tmp_path: Path, capsys) -> None:
    src = make_image_folder(tmp_path / "src", per_class=2, classes=("a", "c"))
    (src / "b").mkdir()
    assert run("write", src, tmp_path / "ds", "--quiet") == 0
    assert "['b'] hold no images" in capsys.readouterr().out
    assert manifest_of(tmp_path / "ds")["label_names"] == ["a", "b", "c"]
