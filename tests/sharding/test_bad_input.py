"""Bad input: one clear message naming the path and the fix, exit code 2, no traceback, no manifest."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from dataio.storage.retry import FIRST_REQUEST_DEADLINE_S
from tests.sharding.conftest import run


def _fails(capsys, *args: object, code: int = 2) -> str:
    assert run(*args) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_missing_source(tmp_path: Path, capsys) -> None:
    err = _fails(capsys, "write", tmp_path / "nope", tmp_path / "ds")
    assert str(tmp_path / "nope") in err and "does not exist" in err
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_empty_source(tmp_path: Path, capsys) -> None:
    (tmp_path / "src" / "cat").mkdir(parents=True)
    err = _fails(capsys, "write", tmp_path / "src", tmp_path / "ds")
    assert "hold no images" in err and str(tmp_path / "src") in err
    (tmp_path / "src" / "cat").rmdir()
    err = _fails(capsys, "write", tmp_path / "src", tmp_path / "ds")
    assert "no class folders" in err and "ROOT/CLASS_NAME" in err


def test_non_empty_destination(image_folder: Path, tmp_path: Path, capsys) -> None:
    dest = tmp_path / "ds"
    assert run("write", image_folder, dest, "--quiet") == 0
    before = (dest / "manifest.json").read_bytes()
    err = _fails(capsys, "write", image_folder, dest, "--quiet")
    assert "not empty" in err and "--overwrite" in err and str(dest) in err
    assert (dest / "manifest.json").read_bytes() == before


@pytest.mark.parametrize("workers", [1, 2])
def test_corrupt_image_fails_with_path_and_fix(image_folder: Path, tmp_path: Path, capsys, workers: int) -> None:
    bad = image_folder / "cat" / "zz_truncated.jpg"
    bad.write_bytes((image_folder / "cat" / "img1.jpg").read_bytes()[:200])  # header fine, data cut
    err = _fails(capsys, "write", image_folder, tmp_path / "ds", "--workers", workers, "--max-samples-per-shard", 4)
    assert str(bad) in err and "--on-error skip" in err
    assert not (tmp_path / "ds" / "manifest.json").exists()


@pytest.mark.parametrize("content", [b"", b"not an image at all"], ids=["empty", "garbage"])
def test_unreadable_image_is_named_once_with_one_piece_of_advice(image_folder: Path, tmp_path: Path, capsys,
                                                                  content: bytes) -> None:
    bad = image_folder / "cat" / "zz_bad.jpg"
    bad.write_bytes(content)
    err = _fails(capsys, "write", image_folder, tmp_path / "ds", "--validate", "header")
    assert str(bad) in err and err.count("--on-error skip") == 1 and "BytesIO" not in err
    assert ("empty (0 bytes)" in err) == (content == b"")
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_unknown_column(tmp_path: Path, capsys) -> None:
    (tmp_path / "t.csv").write_text("path,label\na.jpg,1\n")
    err = _fails(capsys, "write", tmp_path / "t.csv", tmp_path / "ds", "--label-column", "klass")
    assert "'klass'" in err and "['path', 'label']" in err and "--label-column" in err


def test_bad_flag_value(image_folder: Path, tmp_path: Path, capsys) -> None:
    err = _fails(capsys, "write", image_folder, tmp_path / "ds", "--shard-size", "12XB")
    assert "invalid size '12XB'" in err and "256MB" in err
    err = _fails(capsys, "write", image_folder, tmp_path / "ds", "--workers", "0")
    assert "--workers" in err
    for seconds in ("0", "-1", "soon"):
        err = _fails(capsys, "write", image_folder, tmp_path / "ds", "--journal-every", seconds)
        assert "--journal-every" in err and f"invalid value '{seconds}'" in err


def test_corrupt_manifest(image_folder: Path, tmp_path: Path, capsys) -> None:
    dest = tmp_path / "ds"
    assert run("write", image_folder, dest, "--quiet") == 0
    (dest / "manifest.json").write_text('{"shardify_manifest": 1, "format": "tar"')
    for command in ("inspect", "verify"):
        err = _fails(capsys, command, dest)
        assert "manifest.json is not valid JSON" in err and "--overwrite" in err
    doc = {"shardify_manifest": 99}
    (dest / "manifest.json").write_text(json.dumps(doc))
    assert "version 99" in _fails(capsys, "verify", dest)
    (dest / "manifest.json").unlink()
    assert "not a shardify dataset" in _fails(capsys, "inspect", dest)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_endpoint_fails_fast(image_folder: Path, capsys) -> None:
    start = time.monotonic()
    err = _fails(capsys, "write", image_folder, "s3://bucket/ds", "--endpoint-url",
                 f"http://127.0.0.1:{_closed_port()}", "--access-key", "AKIAEXAMPLE", "--secret-key", "s3cr3tvalue")
    # Within the first request's deadline (the code's own, 30 s) plus slack: not retried for minutes.
    assert time.monotonic() - start < FIRST_REQUEST_DEADLINE_S + 5
    assert "s3://bucket/ds" in err and "--endpoint-url" in err
    assert "s3cr3tvalue" not in err


def test_pixel_limit_refuses_large_images(image_folder: Path, tmp_path: Path, capsys) -> None:
    from PIL import Image

    Image.new("RGB", (300, 200)).save(image_folder / "cat" / "huge.png")
    for mode in ("structure", "full", "header"):
        err = _fails(capsys, "write", image_folder, tmp_path / mode, "--max-pixels", 50_000, "--validate", mode)
        assert str(image_folder / "cat" / "huge.png") in err and "60000 pixels exceeds the limit" in err
        assert not (tmp_path / mode / "manifest.json").exists()


def test_header_check_accepts_what_the_default_and_full_checks_reject(image_folder: Path, tmp_path: Path, capsys) -> None:
    """--validate header reads the header only; the default structure walk and a full decode catch a truncated file."""
    import io
    import random

    from PIL import Image

    noise = Image.frombytes("RGB", (128, 128), random.Random(0).randbytes(128 * 128 * 3))
    buf = io.BytesIO()
    noise.save(buf, format="JPEG")
    bad = image_folder / "cat" / "zz_truncated.jpg"
    bad.write_bytes(buf.getvalue()[: buf.tell() * 3 // 4])  # the header survives, the pixels do not
    assert run("write", image_folder, tmp_path / "header", "--validate", "header", "--quiet") == 0
    assert run("verify", tmp_path / "header", "--quiet") == 1  # verify always decodes
    assert "does not decode" in capsys.readouterr().out
    err = _fails(capsys, "write", image_folder, tmp_path / "default", "--quiet")
    assert str(bad) in err and "does not decode" in err and "without EOI (truncated)" in err
    err = _fails(capsys, "write", image_folder, tmp_path / "full", "--validate", "full", "--quiet")
    assert str(bad) in err and "does not decode" in err
