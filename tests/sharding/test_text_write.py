"""`shardify write --tokenizer`: the bundled Python corpus as JSON Lines, as a Hugging Face-style Parquet
export and as a folder of .txt files; tokens round-trip to the text; dtype; tiktoken; resume and append."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sharding.write.writer
from dataio.errors import ShardFormatError
from dataio.format.manifest import read_manifest
from dataio.format.token_layout import read_shard
from dataio.storage.store import Store
from sharding.write.tokenizer import load_tokenizer
from tests.sharding.conftest import manifest_of, run
from tools.text_corpus import documents, write_jsonl

pytestmark = pytest.mark.timeout(120)
FLAGS = ("--tokens-per-shard", 30_000, "--quiet")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[dict[str, str]], Path]:
    """(corpus.jsonl, its documents, a tokenizer.json trained on it), made once for the module."""
    root = tmp_path_factory.mktemp("corpus")
    docs = documents()
    src = write_jsonl(root / "corpus.jsonl", docs)
    assert run("tokenizer", "train", src, "--vocab-size", 2000, "-o", root / "tokenizer.json") == 0
    return src, docs, root / "tokenizer.json"


def stored_documents(dest: Path) -> tuple[list[np.ndarray], dict]:
    """Every document's tokens (EOS included), in manifest order, each shard checked on reading."""
    store = Store(str(dest))
    m = read_manifest(store)
    out = []
    for i in range(m.num_shards):
        tokens, offsets = read_shard(store, m.shard_paths[i], m.tokens, num_tokens=m.shard_num_tokens[i],
                                     num_documents=m.shard_num_samples[i])
        out += [tokens[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
    return out, manifest_of(dest)


def check_round_trip(dest: Path, texts: list[str], tokenizer: Path) -> dict:
    tok = load_tokenizer(str(tokenizer))
    stored, doc = stored_documents(dest)
    assert len(stored) == len(texts)
    for tokens, text in zip(stored, texts):
        assert int(tokens[-1]) == tok.info.eos_id
        assert tok.decode(tokens[:-1]) == text
    return doc


def test_jsonl_corpus_round_trips_with_provenance(corpus, tmp_path, capsys) -> None:
    src, docs, tokenizer = corpus
    dest = tmp_path / "ds"
    assert run("write", src, dest, "--tokenizer", tokenizer, "--workers", 2, *FLAGS) == 0
    out = capsys.readouterr().out
    doc = check_round_trip(dest, [d["text"] for d in docs], tokenizer)
    assert doc["format"] == "tokens" and doc["tokens"]["dtype"] == "uint16" and doc["shards"]["num_tokens"]
    assert doc["tokens"]["tokenizer"]["vocab_size"] == 2000
    assert doc["tokens"]["tokenizer"]["file_hash"] == load_tokenizer(str(tokenizer)).info.file_hash
    assert len(doc["shards"]["path"]) > 1 and f"{len(docs)} documents" in out
    # np.memmap alone reads a shard: tokens, then offsets
    first = dest / doc["shards"]["path"][0]
    tokens = np.memmap(first, dtype="<u2", mode="r")
    offsets = np.fromfile(first.with_suffix(".idx"), dtype="<i8")
    assert offsets[-1] == len(tokens) == doc["shards"]["num_tokens"][0]
    origins = json.loads(first.with_suffix(".sources.json").read_text())["sources"]
    assert origins[:2] == ["corpus.jsonl line 1", "corpus.jsonl line 2"]


def test_hf_parquet_export_and_txt_folder(corpus, tmp_path) -> None:
    _, docs, tokenizer = corpus
    texts = [d["text"] for d in docs[:60]]
    export = tmp_path / "export" / "data"
    export.mkdir(parents=True)
    meta = {b"huggingface": json.dumps({"info": {"features": {"id": {"dtype": "string", "_type": "Value"},
                                                              "text": {"dtype": "string", "_type": "Value"}}}})}
    for k, part in enumerate((texts[:25], texts[25:])):
        table = pa.table({"id": [f"{k}-{i}" for i in range(len(part))], "text": part})
        pq.write_table(table.replace_schema_metadata(meta), export / f"train-0000{k}-of-00002.parquet",
                       row_group_size=7)  # several row groups: a shard reads only its own
    (tmp_path / "export" / "README.md").write_text("# a dataset card, not a document")
    assert run("write", tmp_path / "export", tmp_path / "pq", "--tokenizer", tokenizer, *FLAGS) == 0
    check_round_trip(tmp_path / "pq", texts, tokenizer)
    folder = tmp_path / "txt"
    folder.mkdir()
    for i, text in enumerate(texts[:12]):
        (folder / f"doc{i:02d}.{'md' if i % 2 else 'txt'}").write_text(text, encoding="utf-8")
    assert run("write", folder, tmp_path / "t", "--tokenizer", tokenizer, *FLAGS) == 0
    check_round_trip(tmp_path / "t", texts[:12], tokenizer)


def test_gzip_jsonl_dedup_empty_and_length_limits_are_counted(corpus, tmp_path, capsys) -> None:
    import gzip

    _, docs, tokenizer = corpus
    texts = [d["text"] for d in docs[:20]]
    lines = [*texts, texts[3], "", "   ", texts[5], "ok"]
    src = tmp_path / "c.jsonl.gz"
    src.write_bytes(gzip.compress("".join(json.dumps({"body": t}) + "\n" for t in lines).encode()))
    assert run("write", src, tmp_path / "d", "--tokenizer", tokenizer, "--text-field", "body", "--dedup",
               "--min-tokens", 2, *FLAGS) == 0
    out = capsys.readouterr().out
    assert "duplicate 2" in out and "empty 2" in out and "too_short 1" in out
    check_round_trip(tmp_path / "d", texts, tokenizer)
    assert run("write", src, tmp_path / "e", "--tokenizer", tokenizer, "--text-field", "body", "--keep-empty",
               *FLAGS) == 0
    assert len(stored_documents(tmp_path / "e")[0]) == len(lines)
    capsys.readouterr()
    assert run("write", src, tmp_path / "f", "--tokenizer", tokenizer, "--text-field", "body", "--max-tokens", 3,
               "--eos-token", "<|endoftext|>", *FLAGS) == 0
    assert "too_long" in capsys.readouterr().out
    assert all(len(t) <= 4 for t in stored_documents(tmp_path / "f")[0])  # "ok" and the like, with their EOS


def test_bad_utf8_replaced_and_counted_or_refused(corpus, tmp_path, capsys) -> None:
    _, _, tokenizer = corpus
    src = tmp_path / "bad.jsonl"
    src.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9 au lait"}\n{"text": "\\ud800 lone"}\n')
    assert run("write", src, tmp_path / "r", "--tokenizer", tokenizer, *FLAGS) == 0
    assert "bad UTF-8 replaced: 2" in capsys.readouterr().out
    stored, _ = stored_documents(tmp_path / "r")
    assert load_tokenizer(str(tokenizer)).decode(stored[1][:-1]) == "caf\ufffd au lait"
    assert run("write", src, tmp_path / "x", "--tokenizer", tokenizer, "--on-bad-utf8", "refuse", *FLAGS) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl line 2" in err and "UTF-8" in err and "--on-bad-utf8 replace" in err
    assert not (tmp_path / "x" / "manifest.json").exists()


def test_missing_text_field_is_named_with_its_line_or_row(corpus, tmp_path, capsys) -> None:
    _, _, tokenizer = corpus
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "one"}\n\n{"content": "two"}\n')
    assert run("write", src, tmp_path / "o", "--tokenizer", tokenizer, *FLAGS) == 2
    err = capsys.readouterr().err
    assert "a.jsonl line 3" in err and "'text'" in err and "--text-field" in err and "content" in err
    pq.write_table(pa.table({"body": ["a", None]}), tmp_path / "t.parquet")
    assert run("write", tmp_path / "t.parquet", tmp_path / "p", "--tokenizer", tokenizer, *FLAGS) == 2
    assert "no column 'text'" in capsys.readouterr().err
    assert run("write", tmp_path / "t.parquet", tmp_path / "p", "--tokenizer", tokenizer, "--text-field", "body",
               *FLAGS) == 2
    assert "t.parquet row 1" in capsys.readouterr().err


def test_dtype_follows_the_vocabulary(tmp_path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from dataio.format.token_layout import TokenizerInfo, TokensInfo, dtype_for

    assert dtype_for(65536) == "uint16" and dtype_for(65537) == "uint32"
    with pytest.raises(ValueError, match="does not fit"):
        dtype_for(2**32 + 1)
    with pytest.raises(ValueError, match="do not fit uint16"):
        TokensInfo(tokenizer=TokenizerInfo(name="t", kind="hf", vocab_size=70000, eos_id=0), dtype="uint16")
    vocab = {"<|endoftext|>": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(69998)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(tmp_path / "big.json"))
    write_jsonl(tmp_path / "w.jsonl", [{"text": "w1 w69000 w5"}, {"text": "w65536"}])
    assert run("write", tmp_path / "w.jsonl", tmp_path / "d", "--tokenizer", tmp_path / "big.json", *FLAGS) == 0
    stored, doc = stored_documents(tmp_path / "d")
    assert doc["tokens"]["dtype"] == "uint32"
    assert [t.tolist() for t in stored] == [[3, 69002, 7, 0], [65538, 0]]


def test_tiktoken_file_is_accepted(tmp_path) -> None:
    merges = [b"th", b"the", b"he", b"in", b" t"]
    ranks = [bytes([b]) for b in range(256)] + merges
    (tmp_path / "tiny.tiktoken").write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))
    texts = ["the thin theory", "inhere the end"]
    write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in texts])
    assert run("write", tmp_path / "c.jsonl", tmp_path / "d", "--tokenizer", tmp_path / "tiny.tiktoken", *FLAGS) == 0
    doc = check_round_trip(tmp_path / "d", texts, tmp_path / "tiny.tiktoken")
    assert doc["tokens"]["tokenizer"]["kind"] == "tiktoken" and doc["tokens"]["tokenizer"]["eos_id"] == len(ranks)


def test_resume_and_append(corpus, tmp_path, monkeypatch, capsys) -> None:
    src, docs, tokenizer = corpus
    args = ("--tokenizer", tokenizer, "--workers", 1, "--tokens-per-shard", 20_000, "--quiet")
    whole, dest = tmp_path / "whole", tmp_path / "ds"
    assert run("write", src, whole, *args) == 0
    real, calls = sharding.write.writer.write_shard, []

    def flaky(job, task, *a, **kw):
        calls.append(task.index)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return real(job, task, *a, **kw)

    monkeypatch.setattr(sharding.write.writer, "write_shard", flaky)
    assert run("write", src, dest, *args) == 130
    assert not (dest / "manifest.json").exists()
    assert run("write", src, dest, *args, "--resume", "--min-tokens", 3) == 2  # other options: refused
    assert "['tokens']" in capsys.readouterr().err
    calls.clear()
    monkeypatch.setattr(sharding.write.writer, "write_shard", real)
    assert run("write", src, dest, *args, "--resume") == 0
    a, b = manifest_of(dest), manifest_of(whole)
    for doc in (a, b):
        doc.pop("created_utc"), doc.pop("tool_version")
    assert a == b
    # append: new documents as new shards of a new version; another tokenizer is refused
    extra = write_jsonl(tmp_path / "more.jsonl", docs[:10])
    assert run("append", extra, dest, "--tokenizer", tokenizer, "--quiet") == 0
    check_round_trip(dest, [d["text"] for d in docs] + [d["text"] for d in docs[:10]], tokenizer)
    other = tmp_path / "other.json"
    assert run("tokenizer", "train", extra, "--vocab-size", 300, "-o", other) == 0
    assert run("append", extra, dest, "--tokenizer", other, "--quiet") == 2
    assert "append with the dataset's tokenizer" in capsys.readouterr().err
    assert run("append", extra, dest, "--quiet") == 2
    assert "with --tokenizer FILE" in capsys.readouterr().err


def test_a_corrupt_block_names_the_shard_and_document(corpus, tmp_path) -> None:
    src, _, tokenizer = corpus
    dest = tmp_path / "ds"
    assert run("write", src, dest, "--tokenizer", tokenizer, *FLAGS) == 0
    doc = manifest_of(dest)
    rel = doc["shards"]["path"][0]
    data = bytearray((dest / rel).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (dest / rel).write_bytes(bytes(data))
    with pytest.raises(ShardFormatError, match=r"shard-000000\.tokens: token block 0 \(document \d+ "):
        stored_documents(dest)


def test_text_without_a_tokenizer_or_with_a_missing_one_is_explained(tmp_path, capsys) -> None:
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "a.txt").write_text("hello")
    assert run("write", tmp_path / "txt", tmp_path / "d", "--quiet") == 2
    assert "pass --tokenizer FILE" in capsys.readouterr().err
    assert run("write", tmp_path / "txt", tmp_path / "d", "--tokenizer", tmp_path / "none.json", "--quiet") == 2
    err = capsys.readouterr().err
    assert "none.json: no such tokenizer file" in err and "shardify tokenizer train" in err
    (tmp_path / "bad.json").write_text("{}")
    assert run("write", tmp_path / "txt", tmp_path / "d", "--tokenizer", tmp_path / "bad.json", "--quiet") == 2
    assert "not a Hugging Face tokenizer.json" in capsys.readouterr().err
    assert run("tokenizer", "train", tmp_path / "txt", "--vocab-size", 300, "-o", tmp_path / "t.json") == 0
    assert run("write", tmp_path / "txt", tmp_path / "d", "--tokenizer", tmp_path / "t.json", "--eos-token", "<nope>",
               "--quiet") == 2
    assert "--eos-token '<nope>' is not in the tokenizer's vocabulary" in capsys.readouterr().err
