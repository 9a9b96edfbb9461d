"""Image-text pairs in object storage (a real SeaweedFS on 127.0.0.1): `shardify write --captions`
from an s3:// folder of x.jpg + x.txt (+ x.json), the pair dataset written to s3:// with its captions'
tokenizer and loaded from there with the captions tokenized in the workers by that tokenizer."""

from __future__ import annotations

import pytest

from dataio import make_loader
from dataio.format.manifest import read_manifest
from dataio.storage.store import Store
from dataio.stream.captions import load_caption_tokenizer
from sharding.write.tokenizer import train_bpe
from tests.sharding.conftest import run
from tools.pair_data import pair, write_pair_folder

pytestmark = pytest.mark.timeout(180)
NUM = 9


def _flags(server) -> list[str]:
    return ["--endpoint-url", server.endpoint_url, "--access-key", server.key, "--secret-key", server.secret,
            "--region", "us-east-1"]


def test_pairs_from_an_s3_folder_write_to_s3_and_load_with_captions_tokenized(s3_server, tmp_path) -> None:
    bucket = s3_server.new_bucket()
    local = write_pair_folder(tmp_path / "src", NUM, size=16)
    src = Store(f"s3://{bucket}/raw/pairs", s3_server.options())
    for path in sorted(local.rglob("*")):
        src.write_bytes(str(path.relative_to(local)), path.read_bytes())
    tok = str(tmp_path / "tok.json")
    train_bpe([c for i in range(NUM) for c in pair(i)[1]], 300, tok)
    dest = f"s3://{bucket}/datasets/pairs"
    assert run("write", src.raw_url, dest, "--captions", "--tokenizer", tok, "--max-samples-per-shard", 4, "--quiet",
               *_flags(s3_server)) == 0
    manifest = read_manifest(Store(dest, s3_server.options()))
    assert manifest.num_samples == NUM and manifest.captions is not None
    # the same folder written from local disk: the same shards, byte for byte
    assert run("write", local, tmp_path / "ds", "--captions", "--max-samples-per-shard", 4, "--quiet") == 0
    assert read_manifest(Store(str(tmp_path / "ds"))).shard_checksums == manifest.shard_checksums

    t = load_caption_tokenizer(tok)
    # no tokenizer=: the one the manifest names, fetched once from the bucket
    loader = make_loader(dest, storage=s3_server.options(), batch_size=3, image_size=16, context_length=8,
                         num_workers=1, seed=2)
    seen = set()
    for batch in loader:
        assert batch["image"].shape == (3, 3, 16, 16)
        for i, key in enumerate(batch["__key__"]):
            n = int(batch["attention_mask"][i].sum())
            ids = batch["input_ids"][i].tolist()
            assert ids[:n] in [[*t.encode_batch([c])[0][:7], t.end_id] for c in pair(int(key))[1]], key
            seen.add(key)
    loader.close()
    assert len(seen) == NUM


def test_an_s3_prefix_without_images_is_refused_naming_it(s3_server, capsys) -> None:
    bucket = s3_server.new_bucket()
    Store(f"s3://{bucket}/notes", s3_server.options()).write_bytes("a.txt", b"a caption without its image")
    assert run("write", f"s3://{bucket}/notes", f"s3://{bucket}/out", "--captions", "--quiet", *_flags(s3_server)) == 2
    err = capsys.readouterr().err
    assert f"s3://{bucket}/notes" in err and "no images found" in err and s3_server.secret not in err
