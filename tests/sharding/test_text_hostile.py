"""Text writes on input the corpus tests never saw (issue 32): a missing output folder, a tokenizer whose ids
pass its vocabulary, binary .txt files, whitespace-only documents, bad UTF-8 named, a damaged lease, and one
long document tokenized in pieces, in bounded memory, to the same ids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import sharding.write.tokenizer as tokenizer_module
from dataio.format.versions import LEASE_NAME
from sharding.write.lease import LeaseInfo
from sharding.write.tokenizer import cut_points, load_tokenizer
from tests.sharding.conftest import run
from tests.sharding.test_text_write import FLAGS, stored_documents
from tools.text_corpus import documents, write_jsonl

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tok")
    src = write_jsonl(root / "corpus.jsonl", documents())
    assert run("tokenizer", "train", src, "--vocab-size", 1000, "-o", root / "tokenizer.json") == 0
    return root / "tokenizer.json"


def test_tokenizer_train_into_a_missing_folder_names_it(tmp_path: Path, capsys) -> None:
    # It used to end in the library's "Exception: No such file or directory (os error 2)", no path named.
    (tmp_path / "a.txt").write_text("some text to train on " * 50)
    out = tmp_path / "missing" / "dir" / "tok.json"
    assert run("tokenizer", "train", tmp_path / "a.txt", "--vocab-size", 300, "-o", out) == 2
    err = capsys.readouterr().err
    assert f"-o {out}: the folder {out.parent} does not exist; create it first" in err and "Traceback" not in err
    assert not (tmp_path / "missing").exists()


def test_a_tokenizer_with_ids_past_its_vocabulary_is_refused_leaving_nothing(tmp_path: Path, capsys) -> None:
    # It used to fail with an OverflowError traceback, leaving shards/ and a journal without a manifest.
    from tokenizers import Tokenizer, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: 65_536 + i for i, c in enumerate(alphabet)}  # declared vocabulary: 256 + 1; ids from 65,536
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(tmp_path / "wide.json"))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("hello world")
    assert run("write", tmp_path / "src", tmp_path / "d", "--tokenizer", tmp_path / "wide.json", "--quiet") == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'wide.json'}: 256 token id(s) lie outside its vocabulary of 257 ids (0..256): " in err
    assert "=65536" in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()


def test_a_binary_file_in_a_txt_folder_is_refused_naming_it(tokenizer: Path, tmp_path: Path, capsys) -> None:
    # It used to be written as text.
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("fine text")
    (tmp_path / "src" / "b.txt").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00binary")
    assert run("write", tmp_path / "src", tmp_path / "d", "--tokenizer", tokenizer, *FLAGS) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'src' / 'b.txt'}: holds NUL bytes (the first at byte 7): a binary file, not text" in err
    assert not (tmp_path / "d" / "manifest.json").exists()


def test_keep_empty_keeps_a_whitespace_document_as_just_its_eos(tokenizer: Path, tmp_path: Path) -> None:
    # It used to keep "   " as 3 space tokens and the EOS.
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": "one"}, {"text": "   "}, {"text": "\n\t"}, {"text": "two"}])
    assert run("write", src, tmp_path / "d", "--tokenizer", tokenizer, "--keep-empty", *FLAGS) == 0
    stored, _ = stored_documents(tmp_path / "d")
    eos = load_tokenizer(str(tokenizer)).info.eos_id
    assert [d.tolist() for d in stored[1:3]] == [[eos], [eos]] and len(stored[0]) > 1


def test_bad_utf8_counts_name_their_documents(tokenizer: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_bytes(b"caf\xe9")
    (tmp_path / "src" / "b.txt").write_text("fine")
    (tmp_path / "src" / "c.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "\\ud800 lone"}\n')
    assert run("write", tmp_path / "src" / "c.jsonl", tmp_path / "j", "--tokenizer", tokenizer, *FLAGS) == 0
    assert "documents with bad UTF-8 replaced: 1 (in c.jsonl line 2)" in capsys.readouterr().out
    (tmp_path / "src" / "c.jsonl").unlink()
    assert run("write", tmp_path / "src", tmp_path / "d", "--tokenizer", tokenizer, *FLAGS) == 0
    assert "documents with bad UTF-8 replaced: 1 (in a.txt)" in capsys.readouterr().out


def test_a_token_write_says_it_took_over_a_damaged_lease(tokenizer: Path, tmp_path: Path, capsys) -> None:
    # Image writes printed the note; token writes did not.
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": "one two"}])
    now = time.time()
    (tmp_path / "d" / "versions").mkdir(parents=True)
    doc = json.loads(LeaseInfo(host="h", pid=1, command="write", token="t", started_s=now, heartbeat_s=now).to_bytes())
    (tmp_path / "d" / LEASE_NAME).write_text(json.dumps({**doc, "heartbeat_s": "soon"}))
    assert run("write", src, tmp_path / "d", "--tokenizer", tokenizer, *FLAGS) == 0
    assert "note: took over a damaged lease" in capsys.readouterr().out


def _long_text(num_chars: int) -> str:
    """Prose with single and runs of spaces, newlines, tabs, punctuation and digits, and one 3,000-letter word."""
    base = "\n\n".join(d["text"] for d in documents()[:40]) + "  two  spaces\t\ttabs 12345 !!! " + "x" * 3000 + " "
    return (base * (num_chars // len(base) + 1))[:num_chars]


def test_a_long_document_is_encoded_in_pieces_to_the_whole_documents_ids(tokenizer: Path, monkeypatch) -> None:
    tok = load_tokenizer(str(tokenizer))
    text = _long_text(300_000)
    whole = np.asarray(tok._encode([text])[0], dtype=np.uint32)
    monkeypatch.setattr(tokenizer_module, "LONG_DOCUMENT_CHARS", 20_000)
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 5_000)
    cuts = cut_points(text, 5_000)
    assert len(cuts) >= 60 and all(text[c] == " " and not text[c - 1].isspace() for c in cuts[:10])
    pieces, short = tok.encode_batch([text, "short one"])
    assert np.array_equal(pieces, whole) and short.tolist() == tok._encode(["short one"])[0]


def test_cut_points_fall_back_to_a_hard_cut_without_a_space() -> None:
    assert cut_points("x" * 25, 10) == [10, 20]
    assert cut_points("ab cd" * 5, 10) == [7, 12, 17]  # before " cd" each time: the space follows a letter
    assert cut_points(" " * 25, 10) == [10, 20]


@pytest.mark.slow  # a child process tokenizing 8 MB
@pytest.mark.timeout(300)
def test_an_8_mb_document_is_tokenized_in_bounded_memory(tokenizer: Path, tmp_path: Path) -> None:
    """Peak RSS of a child tokenizing one 8 MB document, over what it held before encoding: a measurement.
    Whole, the tokenizer takes ~130-200 bytes per character (1-1.6 GB here); in pieces, about the ids and the
    text (8 MB is 8 calls of PIECES_PER_CALL pieces: as bounded as 20 MB, at 2/5 of the CPU)."""
    script = (
        "import resource, sys\n"
        "from tests.sharding.test_text_hostile import _long_text\n"
        "from sharding.write.tokenizer import load_tokenizer\n"
        f"tok = load_tokenizer({str(tokenizer)!r})\n"
        "text = _long_text(8_000_000)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "(ids,) = tok.encode_batch([text])\n"
        "print(len(ids), before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    got = subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=280)
    assert got.returncode == 0, got.stderr
    num_tokens, before_kib, peak_kib = map(int, got.stdout.split())
    assert num_tokens > 400_000
    assert (peak_kib - before_kib) / 1024 < 400, f"peak RSS grew by {(peak_kib - before_kib) / 1024:.0f} MiB"
