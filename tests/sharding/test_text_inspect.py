"""`shardify inspect` and `verify` of token datasets, and a token dataset in object storage (SeaweedFS)."""

from __future__ import annotations

import numpy as np
import pytest

from dataio.format.manifest import read_manifest
from dataio.format.token_layout import SUM_DTYPE, read_array, read_token_range, token_sums_path
from dataio.storage.store import Store
from sharding.write.tokenizer import load_tokenizer
from tests.sharding.conftest import manifest_of, run
from tools.text_corpus import documents, write_jsonl

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(dataset, its documents, tokenizer.json) of a small part of the bundled corpus."""
    root = tmp_path_factory.mktemp("text")
    docs = documents()[:40]
    src = write_jsonl(root / "c.jsonl", docs)
    assert run("tokenizer", "train", src, "--vocab-size", 600, "-o", root / "tok.json") == 0
    assert run("write", src, root / "ds", "--tokenizer", root / "tok.json", "--tokens-per-shard", 10_000,
               "--quiet") == 0
    return root / "ds", docs, root / "tok.json"


def test_inspect_shows_tokens_documents_lengths_and_decoded_documents(written, tmp_path, capsys) -> None:
    dest, docs, tok = written
    assert run("inspect", dest, "--show", 2, "--tokenizer", tok) == 0
    out = capsys.readouterr().out
    m = manifest_of(dest)
    assert str(len(docs)) in out
    assert str(sum(m["shards"]["num_tokens"])) in out and "tok.json" in out and "document lengths" in out
    assert docs[0]["text"].splitlines()[0] in out and docs[1]["text"].splitlines()[0] in out
    assert "document 2 " not in out
    assert run("inspect", dest, "--show", 1) == 0  # no tokenizer: ids
    assert "pass --tokenizer" in capsys.readouterr().out
    other = tmp_path / "other.json"
    assert run("tokenizer", "train", dest.parent / "c.jsonl", "--vocab-size", 400, "-o", other) == 0
    assert run("inspect", dest, "--show", 1, "--tokenizer", other) == 2
    assert "not the dataset's" in capsys.readouterr().err


def test_verify_passes_then_names_a_corrupt_document(written, tmp_path, capsys) -> None:
    import shutil

    dest = tmp_path / "copy"
    shutil.copytree(written[0], dest)
    assert run("verify", dest, "--quiet") == 0
    assert "every document ends with EOS" in capsys.readouterr().out
    rel = manifest_of(dest)["shards"]["path"][1]
    data = bytearray((dest / rel).read_bytes())
    data[-3] ^= 0x01
    (dest / rel).write_bytes(bytes(data))
    assert run("verify", dest, "--quiet") == 1
    out = capsys.readouterr().out
    assert "PROBLEM" in out and rel in out and "checksum" in out


@pytest.mark.slow
def test_write_from_and_to_object_storage_with_ranged_reads(s3_server, written, capsys) -> None:
    _, docs, tok = written
    flags = ["--endpoint-url", s3_server.endpoint_url, "--access-key", s3_server.key, "--secret-key",
             s3_server.secret, "--region", "us-east-1"]
    bucket = s3_server.new_bucket()
    src_store = Store(f"s3://{bucket}/corpus", s3_server.options())
    src_store.write_bytes("part-0.jsonl", (written[0].parent / "c.jsonl").read_bytes())
    url = f"s3://{bucket}/tokens"
    assert run("write", f"s3://{bucket}/corpus", url, "--tokenizer", tok, "--tokens-per-shard", 10_000,
               "--workers", 2, "--quiet", *flags) == 0
    assert run("verify", url, "--quiet", *flags) == 0
    out = capsys.readouterr().out
    assert s3_server.secret not in out
    store = Store(url, s3_server.options())
    m = read_manifest(store)
    assert m.num_samples == len(docs) and m.shard_checksums == read_manifest(Store(str(written[0]))).shard_checksums
    # a sequence-sized ranged read, checked against its block's checksum
    rel, n = m.shard_paths[0], m.shard_num_tokens[0]
    sums = read_array(store, token_sums_path(rel), SUM_DTYPE)
    part = read_token_range(store, rel, n // 3, n // 3 + 17, m.tokens, num_tokens=n, sums=sums)
    whole = np.memmap(written[0] / rel, dtype="<u2", mode="r")
    assert part.tolist() == whole[n // 3:n // 3 + 17].tolist()
    assert load_tokenizer(str(tok)).decode(whole[:8]) in docs[0]["text"]


@pytest.mark.slow
def test_parquet_text_from_object_storage(s3_server, written) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    _, docs, tok = written
    flags = ["--endpoint-url", s3_server.endpoint_url, "--access-key", s3_server.key, "--secret-key",
             s3_server.secret, "--region", "us-east-1"]
    bucket = s3_server.new_bucket()
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"text": [d["text"] for d in docs[:15]]}), sink, row_group_size=4)
    Store(f"s3://{bucket}", s3_server.options()).write_bytes("in/train.parquet", sink.getvalue().to_pybytes())
    url = f"s3://{bucket}/out"
    assert run("write", f"s3://{bucket}/in/train.parquet", url, "--tokenizer", tok, "--tokens-per-shard", 3000,
               "--quiet", *flags) == 0
    m = read_manifest(Store(url, s3_server.options()))
    assert m.num_samples == 15 and m.num_shards > 1
