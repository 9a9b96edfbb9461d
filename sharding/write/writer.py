"""`shardify write`: plan which samples go to which shard, write shards in parallel, publish the manifest last.

The plan (one ShardTask per shard, sharding/write/plan.py) is computed in the parent from the
scanned refs and the seed alone, so the output is the same for any number of workers. Each
worker (a local process or a Ray task) gets the WriteJob once and writes whole shards, each
published atomically and confirmed by the store (`Store.open_atomic`). A
write is a new version of the dataset (`dataio.format.versions`): its shards go beside the old
version's, a journal records each one confirmed, and the manifest, last, replaces the old one
atomically, so at any moment — even after kill -9 — the prefix holds the complete old dataset or
the complete new one. The old version's shards are deleted after a grace period (the next write
or `shardify gc`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace

from dataio.format.manifest import Manifest, write_manifest
from dataio.format.token_layout import tokenizer_hash_of
from dataio.format.versions import (
    DEFAULT_GRACE_S,
    LEASE_NAME,
    Journal,
    JournalHead,
    JournalSessions,
    is_own,
    journal_dir,
    journal_versions,
    next_generation,
    read_journal,
    version_name,
    write_fingerprint,
    write_head,
)
from dataio.storage.store import Store, redact
from sharding.sources.base import Source, SourceError
from sharding.write.collect import collect
from sharding.write.config import ProgressSink, ShardResult, ShardTask, WriteConfig, WriteJob, layout_of
from sharding.write.lease import Lease
from sharding.write.parallel import run_parallel
from sharding.write.plan import default_prefixes, plan_shards, shard_tasks
from sharding.write.resume import (
    appended_layout,
    appended_manifest,
    appended_source,
    check_append,
    open_for_append,
    resume_point,
)
from sharding.write.shard import shard_files, write_shard
from sharding.write.token_writer import appended_token_manifest, check_token_append, dropped_counts, token_manifest

__all__ = ["WriteConfig", "WriteReport", "prepare_destination", "write_dataset"]


def check_folder(dest: Store) -> None:
    """SourceError when a local DEST is a file: a dataset is a folder."""
    if dest.is_local and os.path.isfile(dest.root):  # (list() would call it empty)
        raise SourceError(f"{dest.url} is a file, not a folder: a dataset is a folder (prefix) of shards and a "
                          "manifest; choose another destination, or remove the file")


def prepare_destination(dest: Store, overwrite: bool) -> int:
    """Check DEST and return the generation of the version this write makes; nothing is deleted.

    An empty prefix gets version 1. A non-empty one needs --overwrite, and then holds only what
    shardify writes (files of others are refused, never touched); the new version goes beside
    the old one, whose shards stay readable until the grace period of gc has passed.
    """
    check_folder(dest)
    existing = [p for p in dest.list() if p != LEASE_NAME]  # the lease: this write's own, held already
    if not existing:
        return 1
    if not overwrite:
        raise SourceError(f"{dest.url} is not empty ({len(existing)} files, e.g. {existing[0]!r}); "
                          + interrupted_advice(dest, existing))
    foreign = [p for p in existing if not is_own(p)]
    if foreign:
        raise SourceError(
            f"{dest.url} holds files shardify did not write ({foreign[:3]}); refusing to write a dataset "
            "among them even with --overwrite; choose another destination"
        )
    return next_generation(existing, journal_versions(existing))


def interrupted_advice(dest: Store, existing: list[str]) -> str:
    """What to do with a non-empty DEST: --resume where a journal shows an interrupted write, else --overwrite."""
    versions = journal_versions(existing)
    head, rows = read_journal(dest, versions[-1], existing) if versions else (None, [])
    if head is None or head.state == "published":
        return ("choose an empty destination, or pass --overwrite to write a new version there (the old one "
                "stays readable until `shardify gc` removes it after its grace period)")
    return (f"it holds an interrupted write ({head.version}, state {head.state}, last progress "
            f"{max(0.0, time.time() - head.updated_s):.0f} s ago; its journal confirms {len(rows)} shard(s)): rerun "
            f"the same command with --resume to continue it (the {len(rows)} confirmed shard(s) are kept, only the "
            "rest are written), or pass --overwrite to start a new version instead (the interrupted one's files "
            "go with `shardify gc` after its grace period)")


def tool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardify")
    except PackageNotFoundError:
        return "0+unknown"


def _manifest(results: list[ShardResult], job: WriteJob) -> Manifest:
    source, config, layout = job.source, job.config, job.layout
    if config.tokens is not None:
        return token_manifest(results, source, config, tool_version())
    kept = [r for r in sorted(results, key=lambda r: r.index) if r.num_samples]
    tar = config.format == "tar"
    return Manifest(
        format=config.format, fields=layout.fields(config.format),
        shard_paths=tuple(r.path for r in kept), shard_num_samples=tuple(r.num_samples for r in kept),
        shard_num_bytes=tuple(r.num_bytes for r in kept), shard_checksums=tuple(r.checksum for r in kept),
        index_paths=tuple(r.index_path for r in kept) if tar else (),  # type: ignore[misc]
        index_num_bytes=tuple(r.index_bytes for r in kept) if tar else (),  # type: ignore[misc]
        index_checksums=tuple(r.index_checksum for r in kept) if tar else (),  # type: ignore[misc]
        row_groups=() if tar else tuple(r.row_groups for r in kept),  # type: ignore[misc]
        # "" / (): a shard a resumed write kept from a journal written before checksums existed
        sums_checksums=tuple(r.sums_checksum or "" for r in kept) if tar else (),
        row_group_checksums=() if tar else tuple(r.row_group_checksums or () for r in kept),
        tool_version=tool_version(), created_utc=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        source=redact(source.description), label_names=source.label_names,
        skipped=tuple(s for r in sorted(results, key=lambda r: r.index) for s in r.skipped),
        captions=getattr(source, "captions", None),  # image-text pairs (sharding/sources/pairs.py)
    )


@dataclass(kw_only=True)
class WriteReport:
    """What a finished write produced: its manifest, the seconds it took, the source bytes read."""

    manifest: Manifest
    seconds: float
    source_bytes: int
    skipped: list[dict[str, str]] = field(default_factory=list)
    version: str = ""
    removed: tuple[str, ...] = ()  # objects of versions retired more than the grace ago, deleted after publishing
    dropped: dict[str, int] = field(default_factory=dict)  # tokens: documents left out by reason (too_short, ...)
    lease_note: str = ""  # said when this write took over an expired lease (sharding/write/lease.py)


class _Journaled:
    """The progress sink of a write, also recording every confirmed shard in the journal it builds.

    Local shards are written without an fsync each (the workers' time); this process fsyncs each
    one's files and directory in a thread as its result arrives (beside the workers' writing),
    and before the journal records a batch (every `journal_every_s`, and before the manifest) it
    waits for those fsyncs: a shard the journal or the manifest names is always on disk."""

    def __init__(self, progress: ProgressSink, dest: Store, lease: Lease, head: JournalHead, *, flush_every_s: float,
                 num_batches: int, sync: bool) -> None:
        # sync: this process fsyncs the shards (local disk, written unsynced by local workers; Ray
        # tasks sync their own, on whichever machine they run)
        self.progress, self.dest, self.lease = progress, dest, lease
        self._syncing: list[Future] = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="shardify-fsync") if sync else None
        # num_batches: a resumed journal's earlier batches stay; each batch waits for `sync` first
        self.journal = Journal(dest, head, flush_every_s=flush_every_s, num_batches=num_batches,
                               before_flush=self.sync)

    def update(self, num_samples: int, num_bytes: int) -> None:
        self.progress.update(num_samples, num_bytes)

    def log_shard(self, result: ShardResult) -> None:
        self.progress.log_shard(result)
        if result.num_samples:
            if self._pool is not None:
                self._syncing.append(self._pool.submit(self.dest.make_durable, shard_files(result)))
            self.journal.add(asdict(result))

    def sync(self) -> None:
        """Wait for the fsyncs of every shard logged so far; the first failure is raised. Then check the
        lease: a write that lost it (another took over) records nothing more."""
        syncing, self._syncing = self._syncing, []
        for future in syncing:
            future.result()
        self.lease.check()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _head(source: Source, config: WriteConfig, generation: int) -> JournalHead:
    options = {k: getattr(config, k) for k in ("format", "shard_size_bytes", "max_samples_per_shard", "shuffle",
                                               "seed", "max_side", "max_pixels", "validate", "on_error",
                                               "num_prefixes")}
    if config.tokens is not None:  # only then: the fingerprints of image and table writes stay as they were
        # the tokenizer by its file's hash, not its path: a resume from another directory is the same write
        options["tokens"] = {k: v for k, v in asdict(config.tokens).items() if k != "tokenizer"}
    described = redact(source.description)
    fingerprint = write_fingerprint(described, options, ((r.key, r.size_bytes) for r in source.refs))
    return JournalHead(version=version_name(generation), fingerprint=fingerprint, options=options, source=described)


def _retire_others(dest: Store, version: str) -> None:
    """Mark the versions this one replaced as retired now: their grace period starts."""
    names = dest.list()
    now = time.time()
    for other in journal_versions(names):
        if other == version:
            continue
        head, _ = read_journal(dest, other, [])
        if head.state == "published" and head.retired_s is None:
            write_head(dest, replace(head, retired_s=now))


def _run(job: WriteJob, tasks: list[ShardTask], sink: _Journaled) -> list[ShardResult]:
    """Write the shards of `tasks` with the configured engine; each confirmed one goes to `sink`."""
    if not tasks:
        return []
    if job.config.engine == "ray":
        from sharding.write.engine_ray import run_ray

        return run_ray(job, tasks, sink)
    if job.config.num_workers == 1 or len(tasks) == 1:
        results = []
        for task in tasks:
            results.append(write_shard(job, task, sink.update, durable=False))
            sink.log_shard(results[-1])
        return results
    return run_parallel(job, tasks, sink)


def write_with_progress(source: Source, dest: Store, config: WriteConfig, *, quiet: bool, resume: bool = False,
                        append: bool = False) -> WriteReport:
    """write_dataset behind the command line's progress bar (samples and bytes of the source), closed
    whatever happens: what `shardify write` and `append` run, for images, tables and text alike."""
    from sharding.progress import Progress

    total = sum(r.size_bytes for r in source.refs)
    progress = Progress(total_samples=len(source.refs), total_bytes=total, what="write", quiet=quiet)
    try:
        return write_dataset(source, dest, config, progress, resume=resume, append=append)
    finally:
        progress.close()


def write_dataset(source: Source, dest: Store, config: WriteConfig, progress: ProgressSink, *,
                  grace_s: float = DEFAULT_GRACE_S, resume: bool = False, append: bool = False) -> WriteReport:
    """Write every shard of a new version, then its manifest; raises (and publishes nothing) if anything fails.

    resume: continue DEST's interrupted write, keeping the shards its journal confirmed; append:
    add the source's samples to DEST's dataset as new shards (see sharding/write/resume.py). After
    publishing, versions retired more than `grace_s` ago are deleted (best effort). The write
    holds DEST's lease throughout (sharding/write/lease.py): LeaseError, before anything is written,
    while another command holds it.
    """
    check_folder(dest)  # before the lease creates anything there
    command = ("append" if append else "write --resume" if resume else
               "write --overwrite" if config.overwrite else "write")
    with Lease(dest, command) as lease:
        report = _write_leased(source, dest, config, progress, lease, grace_s=grace_s, resume=resume, append=append)
    report.lease_note = lease.took_over
    return report


def _write_leased(source: Source, dest: Store, config: WriteConfig, progress: ProgressSink, lease: Lease, *,
                  grace_s: float, resume: bool, append: bool) -> WriteReport:
    start = time.perf_counter()
    old, done, num_batches, head = None, {}, 0, None
    layout = layout_of(source, config)
    if append:
        old, generation = open_for_append(dest)
        if old.format == "tokens" or config.tokens is not None:
            check_token_append(old, config, source.description)
        source = appended_source(source, old, check_append(old, source, layout, source.description))
        config, layout = replace(config, format=old.format), appended_layout(old, layout)
    job = WriteJob(source=source, dest=dest, config=config, layout=layout)
    plan = plan_shards(source.refs, config)
    first = old.num_shards if old else 0  # an append's new shards follow the old ones
    prefixes = config.num_prefixes or default_prefixes(first + len(plan))

    def tasks_of(generation: int) -> list[ShardTask]:
        return shard_tasks(plan, source.refs, generation=generation, first=first, fmt=config.format,
                           num_prefixes=prefixes)

    if resume:
        generation, head, done, num_batches = resume_point(dest, lambda g: _head(source, config, g), tasks_of)
    elif not append:
        generation = prepare_destination(dest, config.overwrite)
    tasks = [t for t in tasks_of(generation) if t.index not in done]
    # GCS resumable uploads record their sessions beside this version's journal, for gc to cancel
    job = replace(job, dest=dest.recording_sessions(JournalSessions(version=version_name(generation))))
    sink = _Journaled(progress, dest, lease, head or _head(source, config, generation),
                      flush_every_s=config.journal_every_s, num_batches=num_batches,
                      sync=dest.is_local and config.engine == "local")
    journal = sink.journal
    journal.start()
    manifest, dropped = _publish(job, tasks, done, old, sink, lease)
    removed: tuple[str, ...] = ()
    with contextlib.suppress(Exception):  # the dataset is published; bookkeeping may lag, gc catches up
        journal.finish(manifest_fingerprint=manifest.fingerprint)
        _retire_others(dest, journal.head.version)
        removed = collect(dest, grace_s=grace_s).removed
    return WriteReport(manifest=manifest, seconds=time.perf_counter() - start,
                       source_bytes=sum(r.size_bytes for r in source.refs), skipped=list(manifest.skipped),
                       version=journal.head.version, removed=removed, dropped=dropped)


def store_named_tokenizer(job: WriteJob, manifest: Manifest, version_dir: str) -> Manifest:
    """A pair write given --tokenizer: its file stored in this version's folder (kept while the version
    lives, gone with it after gc's grace), and named with its hash by the manifest's captions section."""
    path = getattr(job.source, "tokenizer_file", "")
    if not path or manifest.captions is None:
        return manifest
    with open(path, "rb") as f:
        data = f.read()
    rel = f"{version_dir}/tokenizer/{os.path.basename(path)}"
    job.dest.write_bytes(rel, data)
    captions = replace(manifest.captions, tokenizer=rel, tokenizer_hash=tokenizer_hash_of(data))
    return replace(manifest, captions=captions)


def _publish(job: WriteJob, tasks: list[ShardTask], done: dict[int, ShardResult], old: Manifest | None,
             sink: _Journaled, lease: Lease) -> tuple[Manifest, dict[str, int]]:
    """Write the shards of `tasks`, then the manifest naming them and those `done` (and `old`'s when
    appending); on any failure the journal keeps the confirmed shards and says failed, unless this
    write lost its lease: then the journal is the new holder's, and is left alone."""
    journal = sink.journal
    try:
        results = _run(job, tasks, sink)
        dropped = dropped_counts([*done.values(), *results])
        manifest = _manifest([*done.values(), *results], job)
        if old is not None:
            manifest = (appended_token_manifest if job.config.tokens else appended_manifest)(old, manifest)
        if manifest.num_shards == 0:
            raise SourceError(
                f"{job.source.description}: every sample was skipped ({len(manifest.skipped)}; first: "
                f"{manifest.skipped[0]['reason'] if manifest.skipped else '-'}); nothing to write"
            )
        journal.flush()  # every shard the manifest names is in the journal before it is published
        lease.check()  # (flush checks too, but only when it had shards to record)
        manifest = store_named_tokenizer(job, manifest, journal_dir(journal.head.version))
        write_manifest(job.dest, manifest, parts_threshold=job.config.parts_threshold)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            if not lease.lost:  # (its before_flush checks the lease again first)
                journal.flush()  # the shards confirmed so far: what a --resume keeps
        with contextlib.suppress(Exception):
            if not lease.lost:
                journal.fail(redact(str(exc)) or type(exc).__name__)
        raise
    finally:
        sink.close()
    return manifest, dropped
