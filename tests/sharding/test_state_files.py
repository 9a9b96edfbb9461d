"""A write's journal head read field by field (issue 32, 3): a field of the wrong type is refused naming the
file and the field, in words, instead of a TypeError in gc's or --resume's arithmetic later."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dataio.errors import ManifestError
from dataio.format.versions import JournalHead, read_journal, write_head
from dataio.storage.store import Store
from tests.sharding.conftest import run

WRONG = {"version": 1, "fingerprint": 5, "options": [], "source": 1, "state": 3, "started_s": "x",
         "updated_s": "1700000000", "published_s": "x", "retired_s": [], "manifest_fingerprint": 7, "error": None}


def _plant(dest: Path, field: str) -> Path:
    store = Store(str(dest))
    write_head(store, JournalHead(version="v000001", fingerprint="f", started_s=1.0, updated_s=2.0))
    path = dest / "versions" / "v000001" / "journal.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), field: WRONG[field]}))
    return path


@pytest.mark.parametrize("field", sorted(WRONG))
def test_every_journal_field_of_the_wrong_type_is_named(tmp_path: Path, field: str) -> None:
    path = _plant(tmp_path, field)
    with pytest.raises(ManifestError) as got:
        read_journal(Store(str(tmp_path)), "v000001", [])
    assert str(got.value).startswith(f"{path}: malformed journal (its {field!r} is {WRONG[field]!r}"), got.value


def test_resume_on_a_damaged_journal_says_which_file(image_folder: Path, tmp_path: Path, capsys) -> None:
    path = _plant(tmp_path / "ds", "updated_s")
    assert run("write", image_folder, tmp_path / "ds", "--resume", "--workers", 1, "--quiet") == 2
    err = capsys.readouterr().err
    assert f"{path}: malformed journal (its 'updated_s' is '1700000000' (a string), not a number)" in err, err
    assert "Traceback" not in err


def test_an_older_journal_without_the_later_fields_still_reads(tmp_path: Path) -> None:
    path = _plant(tmp_path, "error")
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({k: doc[k] for k in ("shardify_journal", "version", "fingerprint", "state")}))
    head, rows = read_journal(Store(str(tmp_path)), "v000001", [])
    assert head.version == "v000001" and rows == []
