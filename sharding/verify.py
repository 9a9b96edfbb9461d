"""`shardify verify`: every shard and index against the manifest, every sample parsed, every image decoded,
and (manifest version 3) every sample's or row group's bytes against their own checksums, so a
changed shard names the samples that changed.

Problems are collected, not raised, so one run lists all of them, each naming the shard URL and,
where there is one, the sample key.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from dataio.decode import images
from dataio.errors import ShardifyError
from dataio.format.checksums import file_row_group_sums, parse_sums, sample_sums, sums_bytes, sums_path
from dataio.format.manifest import MANIFEST_NAME, Manifest, checksum_bytes
from dataio.format.provenance import read_sources, sources_path
from dataio.format.tar_index import TarIndex, build_index, parse_index
from dataio.format.token_layout import OFFSET_DTYPE, SUM_DTYPE, check_blocks, check_offsets
from dataio.storage.store import Store


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a dataset: where (shard URL), which sample (or ""), what."""

    url: str
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.url}" + (f" sample {self.key!r}" if self.key else "") + f": {self.message}"


def _check_bytes(store: Store, rel: str, size: int, checksum: str, problems: list[Problem]) -> bytes | None:
    url = store.url_of(rel)
    try:
        data = store.read(rel)
    except ShardifyError as exc:
        problems.append(Problem(url, "", f"cannot read ({exc}); restore it or rewrite the dataset"))
        return None
    if len(data) != size:
        problems.append(Problem(url, "", f"size {len(data)} bytes, manifest says {size}: truncated or replaced"))
    elif checksum_bytes(data) != checksum:
        problems.append(Problem(url, "", f"checksum {checksum_bytes(data)} != manifest's {checksum}: content changed"))
    return data


def _check_image(data: bytes, url: str, key: str, max_pixels: int, problems: list[Problem]) -> None:
    try:
        images.validate(data, max_pixels=max_pixels, url=url, key=key)
    except ShardifyError as exc:
        problems.append(Problem(url, key, str(exc).split(": ", 2)[-1]))


def _compare_index(stored: TarIndex, actual: TarIndex, url: str, problems: list[Problem]) -> None:
    if len(stored) != len(actual):
        problems.append(Problem(url, "", f"index lists {len(stored)} samples, the tar holds {len(actual)}"))
    for want, got in zip(stored.samples, actual.samples):
        if want != got:
            problems.append(Problem(url, got.key, f"tar members {got.members} do not match the index {want.members}"))
            return


def _verify_tar(store: Store, m: Manifest, i: int, max_pixels: int) -> list[Problem]:
    shard, problems = m.shard(i), []
    url = store.url_of(shard.path)
    idx = _check_bytes(store, shard.index_path, shard.index_bytes, shard.index_checksum, problems)  # type: ignore[arg-type]
    data = _check_bytes(store, shard.path, shard.num_bytes, shard.checksum, problems)
    if data is None:
        return problems
    try:
        actual = build_index(io.BytesIO(data), url=url)
    except ShardifyError as exc:
        return [*problems, Problem(url, "", str(exc))]
    if len(actual) != shard.num_samples:
        problems.append(Problem(url, "", f"holds {len(actual)} samples, manifest says {shard.num_samples}"))
    if idx is not None:
        try:
            _compare_index(parse_index(idx, url=store.url_of(shard.index_path or "")), actual, url, problems)
        except ShardifyError as exc:
            problems.append(Problem(store.url_of(shard.index_path or ""), "", str(exc)))
    if shard.sums_checksum:
        _check_sample_sums(store, shard.path, shard.sums_checksum, data, actual, problems)
    wants_image = any(f.type == "image" for f in m.fields)
    for sample in actual.samples:
        has_image = False
        for member in sample.members:
            body = data[member.offset : member.offset + member.size]
            if member.ext.rsplit(".", 1)[-1].lower() in images.IMAGE_EXTS:
                has_image = True
                _check_image(body, url, sample.key, max_pixels, problems)
            elif member.ext == "cls" and not body.strip().isdigit():
                problems.append(Problem(url, sample.key, f".cls holds {body[:20]!r}, not an integer label"))
        if wants_image and not has_image:
            problems.append(Problem(url, sample.key, f"has no image field (members {[x.ext for x in sample.members]}); "
                                    "decoding loaders refuse it"))
    return problems


def _check_sample_sums(store: Store, rel: str, checksum: str, data: bytes, actual: TarIndex,
                       problems: list[Problem]) -> None:
    """Each sample's bytes against its checksum in the shard's sidecar (itself checked against the manifest)."""
    side = sums_path(rel)
    raw = _check_bytes(store, side, sums_bytes(len(actual)), checksum, problems)
    if raw is None or len(raw) != sums_bytes(len(actual)):
        return
    try:
        want = parse_sums(raw, num_samples=len(actual), url=store.url_of(side))
    except ShardifyError as exc:
        problems.append(Problem(store.url_of(side), "", str(exc)))
        return
    for sample, got, expected in zip(actual.samples, sample_sums(data, actual.samples), want):
        if got != expected:
            problems.append(Problem(store.url_of(rel), sample.key, "its bytes do not match its checksum in "
                                    f"{side}: changed after the shard was written"))


def _check_row_group_sums(url: str, data: bytes, want: tuple[str, ...], sizes: tuple[int, ...], keys: list[str],
                          problems: list[Problem]) -> None:
    """Each row group's column chunks against the manifest's checksums, naming its rows and keys."""
    import pyarrow as pa

    got = file_row_group_sums(pa.BufferReader(data))
    first = 0
    for g, (a, b) in enumerate(zip(got, want)):
        last = first + sizes[g] - 1 if g < len(sizes) else first
        if a != b:
            span = f"rows {first}-{last}" + (f", keys {keys[first]!r}..{keys[last]!r}" if last < len(keys) else "")
            problems.append(Problem(url, "", f"row group {g} ({span}): its column chunks do not match their "
                                    "checksums in the manifest: changed after the shard was written"))
        first = last + 1
    if len(got) != len(want):
        problems.append(Problem(url, "", f"{len(got)} row groups, the manifest has checksums for {len(want)}"))


def _verify_parquet(store: Store, m: Manifest, i: int, max_pixels: int) -> list[Problem]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    shard, problems = m.shard(i), []
    url = store.url_of(shard.path)
    data = _check_bytes(store, shard.path, shard.num_bytes, shard.checksum, problems)
    if data is None:
        return problems
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))  # not io.BytesIO: see inspect.label_counts
        groups = tuple(pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups))
        table = pf.read()
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...
        return [*problems, Problem(url, "", f"not a readable Parquet file ({type(exc).__name__}: {exc})")]
    if groups != shard.row_groups:
        problems.append(Problem(url, "", f"row groups {groups} != manifest's {shard.row_groups}"))
    image_cols = [f.name for f in m.fields if f.type == "image" and f.name in table.column_names]
    keys = table.column("__key__").to_pylist() if "__key__" in table.column_names else [""] * table.num_rows
    if shard.row_group_checksums:
        _check_row_group_sums(url, data, shard.row_group_checksums, groups, keys, problems)
    present = [False] * table.num_rows
    for col in image_cols:
        for row, (key, value) in enumerate(zip(keys, table.column(col).to_pylist())):
            if isinstance(value, dict):  # a Hugging Face image struct {bytes, path}
                value = value.get("bytes")
                if value is None:
                    problems.append(Problem(url, key, f"image column {col!r} holds no bytes in this row"))
            if value is not None:
                present[row] = True
                _check_image(value, url, key, max_pixels, problems)
    if image_cols:
        problems += [Problem(url, key, f"has no image in any of {image_cols}; decoding loaders refuse it")
                     for key, ok in zip(keys, present) if not ok]
    return problems


def _verify_tokens(store: Store, m: Manifest, i: int, max_pixels: int) -> list[Problem]:
    """A token shard: its three files against the manifest, every block against its checksum, the
    offsets against the counts, every id inside the vocabulary and every document ended by EOS."""
    assert m.tokens is not None
    s, problems = m.shard(i), []
    data = _check_bytes(store, s.path, s.num_bytes, s.checksum, problems)
    index = _check_bytes(store, s.index_path or "", s.index_bytes or 0, s.index_checksum or "", problems)
    sums = _check_bytes(store, sums_path(s.path), sums_bytes_of(m, i), s.sums_checksum, problems)
    if data is None or index is None or sums is None or problems:
        return problems
    url, info = store.url_of(s.path), m.tokens
    offsets = np.frombuffer(index, dtype=OFFSET_DTYPE)
    try:
        check_offsets(offsets, m.shard_num_tokens[i], s.num_samples, url=url)
        check_blocks(data, np.frombuffer(sums, dtype=SUM_DTYPE), 0, info, url=url, offsets=offsets)
    except ShardifyError as exc:
        return [Problem(url, "", str(exc).split(": ", 1)[-1])]
    tokens = np.frombuffer(data, dtype=info.np_dtype)
    if len(tokens) and int(tokens.max()) >= info.tokenizer.vocab_size:
        problems.append(Problem(url, "", f"token id {int(tokens.max())} is outside the vocabulary of "
                                         f"{info.tokenizer.vocab_size}"))
    ends = tokens[offsets[1:] - 1] if len(offsets) > 1 else tokens[:0]
    if bool(np.any(ends != info.tokenizer.eos_id)):
        doc = int(np.flatnonzero(ends != info.tokenizer.eos_id)[0])
        problems.append(Problem(url, str(doc), f"document {doc} does not end with EOS {info.tokenizer.eos_id}"))
    return problems


def sums_bytes_of(m: Manifest, i: int) -> int:
    """The size of a token shard's block checksum sidecar."""
    assert m.tokens is not None
    return 8 * -(-m.shard_num_tokens[i] // m.tokens.block_tokens)


def _check_sources(store: Store, m: Manifest, i: int) -> list[Problem]:
    """The shard's provenance sidecar, when it has one, must describe it (same checksum and count)."""
    rel = sources_path(m.shard_paths[i])
    try:
        if store.exists(rel):
            read_sources(store, m, i)
    except ShardifyError as exc:
        return [Problem(store.url_of(rel), "", str(exc).split(": ", 1)[-1])]
    return []


def verify_dataset(store: Store, manifest: Manifest, *, max_pixels: int = images.DEFAULT_MAX_PIXELS,
                   num_workers: int = 1, on_shard: Callable[[int, int], None] | None = None) -> list[Problem]:
    """Check every shard (threads: reads and decodes release the GIL); `on_shard(samples, bytes)` per shard."""
    check = {"tar": _verify_tar, "parquet": _verify_parquet, "tokens": _verify_tokens}[manifest.format]

    def one(i: int) -> list[Problem]:
        found = check(store, manifest, i, max_pixels) + _check_sources(store, manifest, i)
        if on_shard:
            on_shard(manifest.shard_num_samples[i], manifest.shard_num_bytes[i])
        return found

    broken = _check_parts(store, manifest)
    if broken:
        return broken  # the shard table itself is unreadable: nothing to check the shards against
    with ThreadPoolExecutor(max(1, num_workers)) as pool:
        return [p for found in pool.map(one, range(manifest.num_shards)) for p in found]


def _check_parts(store: Store, manifest: Manifest) -> list[Problem]:
    """A parted manifest: every part readable and matching the root, and the root's fingerprint right."""
    if manifest.parted is None:
        return []
    try:
        actual = manifest.computed_fingerprint()  # reads every part, each checked against the root
    except ShardifyError as exc:
        return [Problem(store.url_of(MANIFEST_NAME), "", str(exc))]
    if actual != manifest.fingerprint:
        return [Problem(store.url_of(MANIFEST_NAME), "", f"fingerprint {manifest.fingerprint} in the root, the parts "
                        f"give {actual}: the root and its parts do not match")]
    return []
