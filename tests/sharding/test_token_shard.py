"""The token shard format at small block sizes: the streaming writer's offsets and block checksums,
ranged reads of any token range checked block by block, and the faults they catch."""

from __future__ import annotations

import io

import numpy as np
import pytest

from dataio.errors import ShardFormatError, StorageError
from dataio.format.token_layout import (
    TokenizerInfo,
    TokensInfo,
    block_sums,
    check_offsets,
    read_shard,
    read_token_range,
)
from dataio.storage.store import RetryPolicy, Store
from sharding.write.token_writer import TokenShardWriter

INFO = TokensInfo(tokenizer=TokenizerInfo(name="t", kind="hf", vocab_size=1000, eos_id=0), dtype="uint16",
                  block_tokens=5)


def _write(tmp_path, docs: list[list[int]]) -> tuple[Store, np.ndarray, np.ndarray]:
    f = io.BytesIO()
    writer = TokenShardWriter(f, "uint16", INFO.block_tokens)
    writer.add([np.asarray(d, dtype="<u2") for d in docs[:2]])  # two calls: the block carry between them
    writer.add([np.asarray(d, dtype="<u2") for d in docs[2:]])
    offsets, sums = writer.close()
    (tmp_path / "s.tokens").write_bytes(f.getvalue())
    (tmp_path / "s.idx").write_bytes(offsets.tobytes())
    (tmp_path / "s.sums").write_bytes(sums.tobytes())
    # Two tries, no back-off: a cut shard's short read is retried (as for object storage) until the policy
    # gives up, which with the default policy is its 120 s budget later.
    return Store(str(tmp_path), retry=RetryPolicy(max_attempts=2, deadline_s=None, base_delay_s=0.0,
                                                  max_delay_s=0.0)), offsets, sums


def test_every_range_reads_back_checked(tmp_path) -> None:
    docs = [[5, 6, 7, 0], [8, 0], [9, 10, 11, 12, 13, 14, 0], [1, 0]]
    store, offsets, sums = _write(tmp_path, docs)
    flat = np.concatenate([np.asarray(d) for d in docs])
    assert offsets.tolist() == [0, 4, 6, 13, 15]
    assert sums.tolist() == block_sums(flat.astype("<u2"), 5).tolist() and len(sums) == 3
    for a in range(len(flat) + 1):
        for b in range(a, len(flat) + 1):
            got = read_token_range(store, "s.tokens", a, b, INFO, num_tokens=len(flat), sums=sums)
            assert got.tolist() == flat[a:b].tolist()
    tokens, offs = read_shard(store, "s.tokens", INFO, num_tokens=15, num_documents=4)
    assert tokens.tolist() == flat.tolist() and offs.tolist() == offsets.tolist()


def test_faults_name_the_shard_and_document(tmp_path) -> None:
    store, offsets, sums = _write(tmp_path, [[5, 6, 7, 0], [8, 0], [9, 10, 11, 12, 13, 14, 0]])
    data = bytearray((tmp_path / "s.tokens").read_bytes())
    data[2 * 11] ^= 1  # token 11: block 2, document 2
    (tmp_path / "s.tokens").write_bytes(bytes(data))
    read_token_range(store, "s.tokens", 0, 10, INFO, num_tokens=13, sums=sums)  # blocks 0-1 are fine
    with pytest.raises(ShardFormatError, match=r"s\.tokens: token block 2 \(document 2 from token 10\)"):
        read_token_range(store, "s.tokens", 10, 12, INFO, num_tokens=13, sums=sums, offsets=offsets)
    (tmp_path / "s.tokens").write_bytes(bytes(data[:20]))  # cut at a block boundary
    with pytest.raises(StorageError, match=r"s\.tokens bytes 0-26: .*got 20 bytes, expected 26"):  # the Store's check
        read_token_range(store, "s.tokens", 0, 13, INFO, num_tokens=13, sums=sums)
    with pytest.raises(ShardFormatError, match="index is corrupt"):
        check_offsets(np.asarray([0, 4, 4, 13]), 13, 3, url="x")  # an empty document
    with pytest.raises(ShardFormatError, match="index is corrupt"):
        read_shard(store, "s.tokens", INFO, num_tokens=13, num_documents=2)
