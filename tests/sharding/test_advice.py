"""What shardify advises after the fact: "not empty" names --resume where a journal shows an interrupted
write; `inspect` never advises an option the write used already."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rich.console import Console

from dataio.format.manifest import read_manifest
from dataio.format.versions import LEASE_NAME
from dataio.storage.store import Store
from sharding.inspect import skipped_table, write_options
from tests.sharding.conftest import manifest_of, run


def test_not_empty_names_resume_where_a_journal_shows_an_interrupted_write(image_folder: Path, tmp_path: Path,
                                                                           capsys) -> None:
    dest = tmp_path / "ds"
    bad = image_folder / "cat" / "zz_truncated.jpg"
    bad.write_bytes((image_folder / "cat" / "img1.jpg").read_bytes()[:200])
    assert run("write", image_folder, dest, "--workers", 1, "--max-samples-per-shard", 4, "--quiet") == 2
    head = json.loads((dest / "versions/v000001/journal.json").read_text())
    assert head["state"] == "failed" and not (dest / LEASE_NAME).exists()  # the failed write released its lease
    confirmed = sum(len(json.loads(p.read_text())["shards"]) for p in (dest / "versions/v000001").glob("shards-*"))
    assert confirmed >= 1
    capsys.readouterr()
    assert run("write", image_folder, dest, "--workers", 1, "--max-samples-per-shard", 4, "--quiet") == 2
    err = capsys.readouterr().err
    assert "interrupted write (v000001, state failed" in err and "with --resume to continue it" in err, err
    assert f"the {confirmed} confirmed shard(s) are kept" in err and "--overwrite" in err
    bad.unlink()
    assert run("write", image_folder, dest, "--workers", 1, "--overwrite", "--quiet") == 0
    assert run("write", image_folder, dest, "--quiet") == 2  # a published dataset: nothing to resume
    err = capsys.readouterr().err
    assert "not empty" in err and "--overwrite" in err and "--resume" not in err


def test_inspect_does_not_advise_the_option_the_write_used(image_folder: Path, tmp_path: Path, capsys) -> None:
    dest = tmp_path / "ds"
    (image_folder / "cat" / "zz_bad.jpg").write_bytes(b"not an image at all")
    assert run("write", image_folder, dest, "--on-error", "skip", "--validate", "header", "--quiet") == 0
    reason = manifest_of(dest)["skipped"][0]["reason"]
    assert reason.startswith("not a readable image") and reason.endswith("re-export it")  # not advised at write
    capsys.readouterr()
    assert run("inspect", dest) == 0
    out = capsys.readouterr().out
    assert "re-export it" in out and "--on-error skip" not in out and "on_error=skip" in out
    # A manifest written before this (its reasons still advise the option): inspect drops the advice.
    store = Store(str(dest))
    m = read_manifest(store)
    assert write_options(store, m)["on_error"] == "skip"
    old = dataclasses.replace(m, skipped=({"key": "000024", "source": "x.jpg",
                                           "reason": f"{reason} or write with --on-error skip"},))
    console = Console(record=True, width=300)
    console.print(skipped_table(old, 20, write_options(store, m)))
    shown = console.export_text()
    assert "re-export it" in shown and "--on-error skip" not in shown


def test_a_malformed_gcs_credentials_file_is_named_in_one_line(tmp_path: Path, capsys) -> None:
    # It used to end a 68-line traceback with KeyError: 'refresh_token', naming no file (issue 32, failure 7).
    bad, missing = tmp_path / "sa.json", tmp_path / "none.json"
    bad.write_text('{"client_email": "someone@example.iam.gserviceaccount.com"}')
    for token, said in ((bad, f"{bad}: not a usable Google credentials file (no 'refresh_token')"),
                        (missing, f"{missing}: no such Google credentials file")):
        conf = tmp_path / "storage.toml"
        conf.write_text(f'[gcs]\ntoken = "{token}"\nendpoint_url = "http://127.0.0.1:9"\n')
        assert run("inspect", "gs://bucket/ds", "--storage-config", conf) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert "[gcs] token of --storage-config" in err and "--access-key" not in err  # not the S3 advice


def test_remote_advice_names_the_flags_of_its_cloud() -> None:
    from sharding.cli import _advice

    assert "--access-key" in _advice("s3") and "--gcs-endpoint-url" in _advice("gs")
    assert "[azure]" in _advice("az") and "--access-key" not in _advice("abfs") + _advice("gs")
