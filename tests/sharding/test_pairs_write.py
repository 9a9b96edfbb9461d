"""`shardify write --captions`: the three pair sources, hostile captions, the manifest's caption
field, and `shardify inspect`'s caption lengths (characters, or tokens with a tokenizer)."""

from __future__ import annotations

import json
import tarfile

import pytest

from dataio.format.manifest import Manifest
from sharding.write.tokenizer import train_bpe
from tests.sharding.conftest import manifest_of, run
from tools.pair_data import pair, write_img2dataset_tars, write_pair_folder, write_pair_table

pytestmark = pytest.mark.timeout(120)


def _members(dest) -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for shard in sorted((dest / "shards").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                out.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return out


def test_pair_folder_writes_captions_and_alternatives(tmp_path) -> None:
    src = write_pair_folder(tmp_path / "src", 9)
    assert run("write", src, tmp_path / "ds", "--captions", "--quiet") == 0
    assert run("verify", tmp_path / "ds", "--quiet") == 0
    m = manifest_of(tmp_path / "ds")
    assert m["captions"] == {"field": "txt", "list_key": "captions"}
    assert Manifest.from_json(m).captions.field == "txt"
    members = _members(tmp_path / "ds")
    assert len(members) == 9
    for i, (key, fields) in enumerate(sorted(members.items())):
        captions = pair(i)[1]
        assert fields["txt"].decode() == captions[0]
        if i % 3 == 0:  # the json's alternatives kept, the first caption included
            assert json.loads(fields["json"])["captions"] == captions


@pytest.mark.parametrize("bad,why", [(None, "is missing"), (b"  \n", "is empty"), (b"caf\xe9", "is not UTF-8")])
def test_bad_caption_refused_naming_the_sample_or_skipped(tmp_path, capsys, bad, why) -> None:
    src = write_pair_folder(tmp_path / "src", 4)
    (src / "00002.txt").unlink()
    if bad is not None:
        (src / "00002.txt").write_bytes(bad)
    assert run("write", src, tmp_path / "ds", "--captions", "--quiet") == 2
    err = capsys.readouterr().err
    assert "00002.jpg" in err and "'000002'" in err and why in err and "--on-error skip" in err
    assert run("write", src, tmp_path / "ok", "--captions", "--quiet", "--on-error", "skip") == 0
    m = manifest_of(tmp_path / "ok")
    assert m["num_samples"] == 3
    assert [s["key"] for s in m["skipped"]] == ["000002"] and why in m["skipped"][0]["reason"]


def test_bad_image_of_a_pair_is_counted_like_a_caption(tmp_path) -> None:
    src = write_pair_folder(tmp_path / "src", 4)
    (src / "00001.jpg").write_bytes((src / "00001.jpg").read_bytes()[:100])  # truncated
    assert run("write", src, tmp_path / "ds", "--captions", "--quiet", "--on-error", "skip") == 0
    assert [s["key"] for s in manifest_of(tmp_path / "ds")["skipped"]] == ["000001"]


def test_img2dataset_tars_write_unchanged_and_note_failed_downloads(tmp_path, capsys) -> None:
    src = write_img2dataset_tars(tmp_path / "i2d", 20, per_tar=8, failed=2)
    assert run("write", src, tmp_path / "ds", "--captions", "--quiet") == 0
    out = capsys.readouterr().out
    assert "6 sample(s) that failed to download" in out and "HTTP 404" in out
    assert run("verify", tmp_path / "ds", "--quiet") == 0
    m = manifest_of(tmp_path / "ds")
    assert m["num_samples"] == 20 and m["captions"]["field"] == "txt"
    members = _members(tmp_path / "ds")
    first = members["000000000"]
    assert set(first) == {"jpg", "txt", "json"} and first["txt"].decode() == pair(0)[1][0]
    assert json.loads(first["json"])["url"].endswith("/0.jpg")  # img2dataset's metadata kept as it was


def test_table_with_a_list_of_captions(tmp_path) -> None:
    table = write_pair_table(tmp_path / "pairs.parquet", 6)
    assert run("write", table, tmp_path / "ds", "--captions", "--quiet") == 0
    assert run("verify", tmp_path / "ds", "--quiet") == 0
    members = _members(tmp_path / "ds")
    assert len(members) == 6
    fields = members["000003"]
    assert fields["txt"].decode() == pair(3)[1][0]
    assert json.loads(fields["json"])["captions"] == pair(3)[1]


def test_table_without_a_caption_column_is_refused(tmp_path, capsys) -> None:
    table = write_pair_table(tmp_path / "pairs.parquet", 3)
    assert run("write", table, tmp_path / "ds", "--captions", "words", "--quiet") == 2
    err = capsys.readouterr().err
    assert "no caption column 'words'" in err and "'caption'" in err and "--captions COLUMN" in err


def test_tars_without_the_caption_member_are_refused(tmp_path, capsys) -> None:
    src = write_img2dataset_tars(tmp_path / "i2d", 4, failed=0)
    assert run("write", src, tmp_path / "ds", "--captions", "caption", "--quiet") == 2
    assert "no 'caption' member" in capsys.readouterr().err


def test_inspect_shows_caption_lengths_in_characters_and_tokens(tmp_path, capsys) -> None:
    src = write_pair_folder(tmp_path / "src", 6)
    assert run("write", src, tmp_path / "ds", "--captions", "--quiet") == 0
    capsys.readouterr()
    assert run("inspect", tmp_path / "ds") == 0
    out = capsys.readouterr().out
    lengths = [len(pair(i)[1][0]) for i in range(6)]
    assert "caption lengths (characters)" in out
    assert f"│ {min(lengths):>3} │" in out and f"│ {max(lengths):>3} │" in out
    texts = [c for i in range(40) for c in pair(i)[1]]
    train_bpe(texts, 300, str(tmp_path / "tok.json"))
    assert run("inspect", tmp_path / "ds", "--tokenizer", tmp_path / "tok.json") == 0
    out = capsys.readouterr().out
    assert "caption lengths (tokens)" in out and "0 longer than a context of 32" in out


def test_captions_section_round_trips_in_both_manifest_forms_and_is_checked(tmp_path) -> None:
    from dataio.errors import ManifestError
    from dataio.format.manifest import read_manifest
    from dataio.storage.store import Store

    src = write_pair_folder(tmp_path / "src", 4)
    assert run("write", src, tmp_path / "parted", "--captions", "--quiet", "--manifest-parts-above", "0",
               "--max-samples-per-shard", "2") == 0
    parted = read_manifest(Store(str(tmp_path / "parted")))
    assert parted.parted is not None and parted.captions.to_json() == {"field": "txt", "list_key": "captions"}
    assert run("write", src, tmp_path / "one", "--captions", "--quiet") == 0
    doc = manifest_of(tmp_path / "one")
    assert Manifest.from_json(doc).captions == parted.captions
    with pytest.raises(ManifestError, match="'captions' must be"):
        Manifest.from_json({**doc, "captions": {"field": "txt", "extra": 1}})
    plain = write_pair_folder(tmp_path / "plain", 2)
    (plain / "cls").mkdir()
    for f in plain.glob("*.jpg"):
        f.rename(plain / "cls" / f.name)
    assert run("write", plain, tmp_path / "images", "--quiet") == 0
    assert "captions" not in manifest_of(tmp_path / "images")  # other datasets' manifests are as before
