"""`shardify gc`: delete what no version needs any more (sharding/write/collect.py), say what.
Like a write, gc holds the destination's lease (sharding/write/lease.py): never beside a running writer.
"""

from __future__ import annotations

from dataclasses import replace

from dataio.format.versions import DEFAULT_GRACE_S
from dataio.storage.store import Store
from sharding.write.collect import GcReport, collect
from sharding.write.lease import Lease


def gc_dataset(store: Store, *, grace_s: float = DEFAULT_GRACE_S, dry_run: bool = False) -> GcReport:
    """`shardify gc`: `collect` holding the destination's lease (LeaseError while a writer holds it);
    a dry run deletes nothing and takes no lease."""
    if dry_run:
        return collect(store, grace_s=grace_s, dry_run=True)
    with Lease(store, "gc") as lease:
        report = collect(store, grace_s=grace_s)
    return replace(report, lease_note=lease.took_over)


def describe(report: GcReport, url: str, *, dry_run: bool = False, max_lines: int = 20) -> list[str]:
    """Lines for people: what was removed (or would be), what was kept and why."""
    p = report.plan
    gone = p.delete if dry_run else report.removed
    verb = "would remove" if dry_run else "removed"
    lines = [f"{url}: {verb} {len(gone)} object(s); kept {p.kept_current} of the current version, "
             f"{p.kept_protected} of live writes or versions retired within the grace, "
             f"{p.kept_young} younger than the grace"
             + (f"; aborted {len(report.aborted_uploads)} stale multipart upload(s)" if report.aborted_uploads else "")
             + (f"; {'would cancel' if dry_run else 'cancelled'} {len(report.cancelled_sessions)} stale resumable "
                "upload session(s)" if report.cancelled_sessions else "")
             + (f"; left {len(p.foreign)} file(s) shardify did not write" if p.foreign else "")]
    lines += [f"  {verb} {rel}" for rel in gone[:max_lines]]
    if len(gone) > max_lines:
        lines.append(f"  ... and {len(gone) - max_lines} more")
    lines += [f"  aborted upload {key}" for key in report.aborted_uploads[:max_lines]]
    lines += [f"  {'would cancel' if dry_run else 'cancelled'} upload session of {rel}"
              for rel in report.cancelled_sessions[:max_lines]]
    if report.lease_note:
        lines.append(f"note: {report.lease_note}")
    return lines

