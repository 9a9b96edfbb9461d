"""Write one shard (in a worker process or inline): load, check, write, publish atomically with its index."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dataio.decode import images
from dataio.errors import CorruptSampleError, ShardifyError
from dataio.format.checksums import dumps_sums, file_row_group_sums, sums_path
from dataio.format.manifest import checksum_bytes
from dataio.format.provenance import dumps_sources, sources_path
from dataio.storage.store import redact
from sharding.sources.base import RawSample, Ref, Source, extras_json
from sharding.write.config import ShardResult, ShardTask, WriteConfig, WriteJob, without_used_advice
from sharding.write.parquet import ParquetShardWriter, parquet_schema
from sharding.write.tar import TarShardWriter
from sharding.write.token_writer import write_token_shard


def prepare_image(sample: RawSample, config: WriteConfig) -> tuple[str, bytes]:
    """Check an image (pixel limit; structure walk by default, every pixel decoded with "full") or downscale it."""
    assert sample.image is not None and sample.image_ext is not None
    if config.max_side is not None:
        return images.downscale(sample.image, config.max_side, max_pixels=config.max_pixels,
                                url=sample.where, key=sample.key)[::-1]
    if config.validate == "full":
        images.validate(sample.image, max_pixels=config.max_pixels, url=sample.where, key=sample.key)
    elif config.validate == "structure":
        images.check_structure(sample.image, max_pixels=config.max_pixels, url=sample.where, key=sample.key)
    else:
        header = images.read_header(sample.image, fast_only=True)
        if header is None:  # not JPEG/PNG, or a header the fast path cannot read: PIL decides
            images.probe(sample.image, max_pixels=config.max_pixels, url=sample.where, key=sample.key)
        else:
            images.check_pixels(header.width, header.height, max_pixels=config.max_pixels,
                                url=sample.where, key=sample.key)
    return sample.image_ext, sample.image


def _sample_error(ref: Ref, exc: Exception, where: str) -> CorruptSampleError:
    message = redact(str(exc))
    if "--on-error skip" in message:  # the check's own advice says it already: add only where skips go
        advice = " (skipped samples are listed in the manifest's 'skipped')"
    else:
        advice = ("; fix or delete it, or rerun with --on-error skip to leave such samples out "
                  "(they are listed in the manifest's 'skipped')")
    return CorruptSampleError(message + advice, url=where, key=ref.key)


def _tar_members(sample: RawSample) -> list[tuple[str, bytes]]:
    members = [(sample.image_ext, sample.image)] if sample.image is not None else []
    if sample.label is not None:
        members.append(("cls", str(sample.label).encode()))
    if any(not isinstance(v, bytes) for v in sample.extras.values()):
        members.append(("json", extras_json(sample.extras)))
    members += [(k, v) for k, v in sample.extras.items() if isinstance(v, bytes)]
    return members  # type: ignore[return-value]


def _parquet_row(sample: RawSample) -> dict[str, Any]:
    row: dict[str, Any] = {"__key__": sample.key, "cls": sample.label, **sample.extras}
    if sample.image is not None:
        row[sample.image_ext] = sample.image  # type: ignore[index]
    return row


def checked_samples(
    source: Source, refs: Sequence[Ref], config: WriteConfig, skipped: list[dict[str, str]],
    report: Callable[[int, int], None],
) -> Iterator[RawSample]:
    """Load `refs` and yield the samples whose image passes the check (resized if asked).

    A bad sample raises CorruptSampleError (on_error="fail") or is appended to `skipped`.
    `report(samples, bytes)` is called every 32 samples and at the end.
    """
    num, num_bytes = 0, 0
    # closing: a failed shard stops the source's reader threads now, not when garbage collected
    with contextlib.closing(source.load(refs)) as loads:
        for ref, loaded in loads:
            try:
                if isinstance(loaded, Exception):
                    raise loaded
                if loaded.image is not None:
                    loaded.image_ext, loaded.image = prepare_image(loaded, config)
            except (ShardifyError, OSError, ValueError) as exc:
                where = loaded.where if isinstance(loaded, RawSample) else getattr(exc, "where", source.description)
                if config.on_error == "fail":
                    raise _sample_error(ref, exc, where) from None
                reason = str(exc).split(f"sample {ref.key!r}: ", 1)[-1]  # where and key have their own columns
                reason = without_used_advice(reason, {"on_error": config.on_error})  # no "use --on-error skip"
                skipped.append({"key": ref.key, "source": redact(where), "reason": redact(reason)})
                continue
            yield loaded
            num, num_bytes = num + 1, num_bytes + ref.size_bytes
            if num >= 32:
                report(num, num_bytes)
                num, num_bytes = 0, 0
    report(num, num_bytes)


def write_shard(job: WriteJob, task: ShardTask, report: Callable[[int, int], None], *,
                durable: bool = True) -> ShardResult:
    """Load, check and write the samples of one shard; publish it (and then its index) atomically.
    durable=False: no fsync of its files on local disk (the caller syncs them: `shard_files`)."""
    if job.config.tokens is not None:  # text tokenized into a token shard (sharding/write/token_writer.py)
        return write_token_shard(job, task, report, durable=durable)
    dest, config, layout, rel = job.dest, job.config, job.layout, task.path
    skipped: list[dict[str, str]] = []
    origins: list[str] = []  # each written sample's source, for the provenance sidecar
    samples = checked_samples(job.source, task.refs, config, skipped, report)
    with dest.open_atomic(rel, durable=durable) as f:
        if config.format == "tar":
            writer: Any = TarShardWriter(f)
            for sample in samples:
                writer.add(sample.key, _tar_members(sample))
                origins.append(sample.origin or sample.where)
            tar_index = writer.close()
        else:
            writer = ParquetShardWriter(f, parquet_schema(layout.image_exts, layout.has_labels, layout.extra_fields))
            for sample in samples:
                writer.add(_parquet_row(sample))
                origins.append(sample.origin or sample.where)
            row_groups = writer.close()
            row_group_checksums = file_row_group_sums(f) if writer.num_samples else ()  # read back: one chunk at a time
    common = dict(index=task.index, path=rel, num_samples=writer.num_samples, num_bytes=writer.num_bytes,
                  checksum=writer.checksum.hexdigest(), skipped=tuple(skipped))
    if writer.num_samples == 0:
        dest.remove(rel)  # every sample skipped: an empty shard is no use to anyone
        return ShardResult(**common)
    # Beside the shard (and its index), never inside: stock readers see only the user's samples.
    dest.write_bytes(sources_path(rel), dumps_sources(rel, common["checksum"], [redact(o) for o in origins]),
                     durable=durable)
    if config.format == "parquet":
        return ShardResult(**common, row_groups=row_groups, row_group_checksums=row_group_checksums)
    index_rel = rel.rsplit(".", 1)[0] + ".idx"
    data = tar_index.dumps()
    dest.write_bytes(index_rel, data, durable=durable)
    sums = dumps_sums(writer.sums)
    dest.write_bytes(sums_path(rel), sums, durable=durable)
    return ShardResult(**common, index_path=index_rel, index_bytes=len(data), index_checksum=checksum_bytes(data),
                       sums_checksum=checksum_bytes(sums))


def shard_files(result: ShardResult) -> list[str]:
    """The files a written shard consists of: the shard, its provenance sidecar, index and checksums."""
    if not result.num_samples:
        return []
    files = [result.path, sources_path(result.path)]
    if result.index_path:
        files += [result.index_path, sums_path(result.path)]
    return files
