"""How many samples a shard's bytes can hold: forged or corrupt sample counts are refused before any
plan sizes arrays by them (a manifest claiming 1e12 samples)."""

from __future__ import annotations

from typing import Any

# A tar sample is at least one member: a 512-byte header and its data padded to 512 bytes.
MIN_TAR_SAMPLE_BYTES = 2 * 512
# A Parquet row takes at least one bit of some column (bit-packed booleans), and a row group at
# least a few bytes of metadata: sample counts beyond these are forged or corrupt.
MIN_PARQUET_ROW_BITS = 1
MIN_ROW_GROUP_BYTES = 4
# A token shard's document is at least its EOS token, of at least 2 bytes (uint16).
MIN_DOCUMENT_BYTES = 2


def max_samples_in(fmt: str, num_bytes: int) -> int:
    """The most samples `num_bytes` of a tar or Parquet shard can hold."""
    if fmt == "tokens":
        return num_bytes // MIN_DOCUMENT_BYTES
    return num_bytes // MIN_TAR_SAMPLE_BYTES if fmt == "tar" else num_bytes * 8 // MIN_PARQUET_ROW_BITS


def implausible_shard(manifest: Any) -> str | None:
    """Why some shard's sample count cannot fit in its bytes (None when all can); O(shards), no I/O.

    Checked before any plan is built, so a forged count (1e12 samples) is refused instead of
    sizing arrays by it; each shard's real byte size is checked when a reader first opens it.
    """
    counts, sizes = manifest.shard_num_samples, manifest.shard_num_bytes
    limit = [max_samples_in(manifest.format, b) for b in sizes]
    if manifest.format == "tar":
        why = f"a tar sample takes at least {MIN_TAR_SAMPLE_BYTES} bytes"
    elif manifest.format == "tokens":
        why = f"a document takes at least its EOS token, {MIN_DOCUMENT_BYTES} bytes"
    else:
        why = "a Parquet row takes at least one bit"
        for i, groups in enumerate(manifest.row_groups):
            if len(groups) * MIN_ROW_GROUP_BYTES > sizes[i] or any(g < 0 for g in groups):
                return (f"shard {manifest.shard_paths[i]} lists {len(groups)} row groups (some negative, or more than "
                        f"its {sizes[i]} bytes can hold)")
    for i, (n, most) in enumerate(zip(counts, limit)):
        if n > most:
            return (f"shard {manifest.shard_paths[i]} claims {n} samples in {sizes[i]} bytes, more than "
                    f"{most} ({why}): the manifest is forged or corrupt")
    return None
