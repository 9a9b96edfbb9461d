"""Small token datasets for loader tests: each token's value is its global id (manifest order), so a
batch tells exactly which tokens it carries; written through the real shard writer and manifest."""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

from dataio.format.checksums import checksum_bytes
from dataio.format.manifest import Manifest, write_manifest
from dataio.format.token_layout import TokenizerInfo, TokensInfo, offsets_path, token_sums_path
from dataio.storage.store import Store
from sharding.write.token_writer import TokenShardWriter

TOKENIZER_HASH = "xxh3_64:0123456789abcdef"


def write_token_dataset(store: Store, doc_lengths: Sequence[Sequence[int]], *, block_tokens: int = 64,
                        file_hash: str = TOKENIZER_HASH, first_id: int = 0) -> Manifest:
    """Shards of documents of these lengths; token values count up from first_id across the whole dataset."""
    total = first_id + sum(sum(d) for d in doc_lengths)
    dtype = "uint16" if total < 1 << 16 else "uint32"
    info = TokensInfo(tokenizer=TokenizerInfo(name="ids", kind="hf", vocab_size=max(2, total), eos_id=0,
                                              file_hash=file_hash), dtype=dtype, block_tokens=block_tokens)
    rows: list[dict] = []
    next_id = first_id
    for i, lengths in enumerate(doc_lengths):
        rel = f"shards/shard-{i:06d}.tokens"
        f = io.BytesIO()
        writer = TokenShardWriter(f, dtype, block_tokens)
        docs = [np.arange(next_id + sum(lengths[:k]), next_id + sum(lengths[:k + 1]), dtype=info.np_dtype)
                for k in range(len(lengths))]
        next_id += sum(lengths)
        writer.add(docs)
        offsets, sums = writer.close()
        idx, sums_data = offsets.tobytes(), sums.tobytes()
        store.write_bytes(rel, f.getvalue())
        store.write_bytes(offsets_path(rel), idx)
        store.write_bytes(token_sums_path(rel), sums_data)
        rows.append(dict(path=rel, docs=len(lengths), bytes=len(f.getvalue()), sum=writer.checksum.hexdigest(),
                         idx=offsets_path(rel), idx_bytes=len(idx), idx_sum=checksum_bytes(idx),
                         sums_sum=checksum_bytes(sums_data), tokens=int(sum(lengths))))

    def col(key: str) -> tuple:
        return tuple(r[key] for r in rows)

    manifest = Manifest(format="tokens", fields=(), shard_paths=col("path"), shard_num_samples=col("docs"),
                        shard_num_bytes=col("bytes"), shard_checksums=col("sum"), index_paths=col("idx"),
                        index_num_bytes=col("idx_bytes"), index_checksums=col("idx_sum"),
                        sums_checksums=col("sums_sum"), shard_num_tokens=col("tokens"), tokens=info)
    write_manifest(store, manifest)
    return manifest
