"""Delete what no version of a dataset needs any more: the end of every write, and `shardify gc`.

The decisions are `dataio.format.versions.plan_gc`'s (a pure function); this module lists the
prefix, reads the manifest and the journals, deletes, and aborts stale multipart uploads. The
caller holds the destination's lease (sharding/write/lease.py): never beside a running writer.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

from dataio.errors import ManifestError
from dataio.format.manifest import MANIFEST_NAME, read_manifest
from dataio.format.manifest_parts import PARTS_DIR
from dataio.format.versions import (
    DEFAULT_GRACE_S,
    GcPlan,
    StoredObject,
    VersionFacts,
    generation_of,
    is_live_write,
    journal_versions,
    named_paths,
    plan_gc,
    read_journal,
    read_session,
    session_records,
)
from dataio.storage.store import Store


@dataclass(frozen=True, kw_only=True, slots=True)
class GcReport:
    """What one gc removed and kept."""

    plan: GcPlan
    removed: tuple[str, ...]
    aborted_uploads: tuple[str, ...]
    cancelled_sessions: tuple[str, ...] = ()  # objects whose recorded GCS upload session was cancelled
    lease_note: str = ""  # said when this gc took over an expired lease


def _utc_s(text: str) -> float | None:
    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()
    except (TypeError, ValueError):
        return None


def collect(store: Store, *, grace_s: float = DEFAULT_GRACE_S, dry_run: bool = False,
            now_s: float | None = None) -> GcReport:
    """Delete objects of versions retired more than `grace_s` ago, abandoned writes' leftovers and
    stale multipart uploads; never what the manifest, a live journal or a young version names."""
    now_s = time.time() if now_s is None else now_s
    listing = store.list_info()
    names = [rel for rel, _, _ in listing]
    versions: dict[str, VersionFacts] = {}
    for version in journal_versions(names):
        # Rows only where the layout does not tell: a later version's objects all sit in its own
        # shards/vN/ directory, so only the first's (directly in shards/) need its journal's rows.
        # (A journal's rows repeat its manifest's: reading them for every version on every run
        # grew with all the shards ever kept.)
        try:
            head, rows = read_journal(store, version, names if generation_of(version) == 1 else [])
        except ManifestError:
            continue  # an unreadable journal protects nothing; its files go once old
        versions[version] = VersionFacts(head=head, paths=frozenset(named_paths(rows)))
    current_paths: frozenset[str] = frozenset()
    parts_dir = published_s = current_version = None
    if MANIFEST_NAME in names:
        manifest = read_manifest(store)  # a damaged manifest stops gc: nothing is safe to judge
        current_paths = frozenset([*manifest.shard_paths, *manifest.index_paths])
        if manifest.parted is not None:
            parts_dir = f"{PARTS_DIR}/{manifest.fingerprint}"
        published_s = _utc_s(manifest.created_utc) or next(m for r, _, m in listing if r == MANIFEST_NAME)
        current_version = next((v for v, f in versions.items() if f.head is not None
                                and f.head.manifest_fingerprint == manifest.fingerprint), None)
    objects = [StoredObject(path=rel, size=size, mtime_s=mtime) for rel, size, mtime in listing]
    plan = plan_gc(objects, current_paths=current_paths, current_parts_dir=parts_dir,
                   current_published_s=published_s, current_version=current_version, versions=versions,
                   now_s=now_s, grace_s=grace_s)
    if dry_run:  # the sessions it would cancel are named, none is
        stale = stale_sessions(store, names, versions, now_s=now_s, grace_s=grace_s)
        return GcReport(plan=plan, removed=(), aborted_uploads=(), cancelled_sessions=tuple(rel for rel, _, _ in stale))
    cancelled = cancel_sessions(store, names, versions, now_s=now_s, grace_s=grace_s)
    removed = []
    for rel in plan.delete:
        store.remove(rel)
        removed.append(rel)
    aborted = store.abort_uploads(grace_s)
    return GcReport(plan=plan, removed=tuple(removed), aborted_uploads=tuple(aborted), cancelled_sessions=cancelled)


def cancel_sessions(store: Store, names: list[str], versions: dict[str, VersionFacts], *, now_s: float,
                    grace_s: float) -> tuple[str, ...]:
    """Cancel the GCS resumable upload sessions that versions no longer being written recorded, and drop
    their records; the objects they were uploading. A session already finished or expired counts too
    (its DELETE answers 404/410): what matters is that none is left open. Unrecorded sessions (gcsfs's,
    or a write with no journal) cannot be listed: GCS expires them a week after they opened."""
    cancelled = []
    for rel, rec, uri in stale_sessions(store, names, versions, now_s=now_s, grace_s=grace_s):
        store.cancel_session(uri)
        store.remove(rec)
        cancelled.append(rel)
    return tuple(cancelled)


def stale_sessions(store: Store, names: list[str], versions: dict[str, VersionFacts], *, now_s: float,
                   grace_s: float) -> list[tuple[str, str, str]]:
    """(object, its session record, the session URI) of every recorded session of a version no longer
    being written: what gc cancels, and what a dry run names."""
    found = []
    for version, facts in versions.items():
        if facts.head is not None and is_live_write(facts.head, now_s, grace_s):
            continue
        for rec in session_records(version, names):
            try:
                rel, uri = read_session(store, rec)
            except ManifestError:
                continue  # an unreadable record names no session; it goes with its version's files
            found.append((rel, rec, uri))
    return found
