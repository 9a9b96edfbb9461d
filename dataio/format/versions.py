"""A dataset's life as versions: the write journal, version ids, and what gc may delete.

A manifest is a version: it names its shards. A write is version number g (a generation: one
more than any version the prefix has seen) and puts its shards beside the old ones, in
`shards/` for the first version and `shards/v00000g/` for each later one, so no object a
reader of the old manifest may open is ever overwritten. It keeps a journal under
`versions/v00000g/`:

    versions/v00000g/journal.json        the head: version, the write's fingerprint (source +
                                         options), state writing|published|failed, times
    versions/v00000g/shards-000000.json  batches of shards completely published (confirmed by
                                         the store), one manifest row each, in publish order
    versions/v00000g/sessions/<id>.json  a GCS resumable upload still open (its session URI), written
                                         before its first byte, removed when done; gc cancels the rest

The new manifest replaces the old one atomically only once every shard it names is confirmed;
then the head says "published" and the version it replaced is "retired" at that moment. A
retired version's shards stay readable for a grace period (readers holding the old manifest
finish their epoch); after it, the next write or `shardify gc` deletes them. gc deletes only
objects in shardify's own namespaces (shards/, versions/, manifest.parts/, temporary files),
never one named by the current manifest, by a live journal (a write that made progress within
the grace) or by a version retired less than the grace ago, and nothing younger than the grace.
Everything here but the two small I/O helpers at the end is a pure function.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import xxhash

from dataio.errors import ManifestError
from dataio.format.manifest import MANIFEST_NAME
from dataio.format.manifest_parts import PARTS_DIR
from dataio.format.schema import damage, typed
from dataio.storage.store import Store

JOURNAL_VERSION = 1
SHARD_DIR = "shards"
VERSIONS_DIR = "versions"
JOURNAL_HEAD = "journal.json"
# The destination's lease (sharding/write/lease.py): one writer or gc at a time; never a version's, never gc'd.
LEASE_NAME = f"{VERSIONS_DIR}/lease.json"
STATES = ("writing", "published", "failed")
DEFAULT_GRACE_S = 3600.0
_VERSION = re.compile(r"v(\d{6,})\Z")
_VERSION_DIR = re.compile(rf"(?:{SHARD_DIR}|{VERSIONS_DIR})/(v\d{{6,}})/")
_TEMP = re.compile(r"(?:^|/)\.[^/]*\.tmp-[^/]*\Z")
OWN_PREFIXES = (f"{SHARD_DIR}/", f"{VERSIONS_DIR}/", f"{PARTS_DIR}/")


def version_name(generation: int) -> str:
    """v000001, v000002, ...: sortable, one per write to a prefix."""
    if generation < 1:
        raise ValueError("generations count from 1")
    return f"v{generation:06d}"


def generation_of(version: str) -> int:
    m = _VERSION.match(version)
    if not m:
        raise ValueError(f"{version!r} is not a version name like v000002")
    return int(m.group(1))


def shard_base(generation: int) -> str:
    """Where a version's shards go: `shards` for the first (today's layout), `shards/v00000g` after."""
    return SHARD_DIR if generation == 1 else f"{SHARD_DIR}/{version_name(generation)}"


def journal_dir(version: str) -> str:
    return f"{VERSIONS_DIR}/{version}"


def is_temporary(rel: str) -> bool:
    """A hidden temporary file of an atomic local publish (`.name.tmp-PID-XXXX`)."""
    return bool(_TEMP.search(rel))


def is_own(rel: str) -> bool:
    """True for objects shardify writes in a dataset prefix (the only ones overwrite and gc touch)."""
    return rel == MANIFEST_NAME or rel.startswith(OWN_PREFIXES) or is_temporary(rel)


def next_generation(paths: Iterable[str], journals: Iterable[str] = ()) -> int:
    """One more than any version seen in `paths` (a listing) or `journals`; 1 for an empty prefix.

    Shards directly under shards/ (or a manifest without journals) are the first version's.
    """
    seen = 0
    for rel in paths:
        m = _VERSION_DIR.match(rel)
        if m:
            seen = max(seen, generation_of(m.group(1)))
        elif rel == MANIFEST_NAME or rel.startswith(f"{SHARD_DIR}/"):
            seen = max(seen, 1)
    for version in journals:
        seen = max(seen, generation_of(version))
    return seen + 1


def write_fingerprint(source: str, options: Mapping[str, Any], refs: Iterable[tuple[str, int]]) -> str:
    """Identifies a write: its source (redacted description, every sample's key and size) and options.

    Two writes with the same fingerprint produce the same shards, so a resumed write may keep
    the shards its journal lists as published.
    """
    h = xxhash.xxh3_64()
    h.update(json.dumps({"source": source, "options": dict(options)}, sort_keys=True, default=str).encode())
    for key, size in refs:
        h.update(f"\0{key}\0{size}".encode())
    return h.hexdigest()


@dataclass(frozen=True, kw_only=True, slots=True)
class JournalHead:
    """The head of one write's journal (versions/vN/journal.json)."""

    version: str
    fingerprint: str
    options: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    state: str = "writing"
    started_s: float = 0.0
    updated_s: float = 0.0
    published_s: float | None = None
    retired_s: float | None = None
    manifest_fingerprint: str | None = None  # the content fingerprint of the manifest it published
    error: str = ""

    def __post_init__(self) -> None:
        generation_of(self.version)
        if self.state not in STATES:
            raise ValueError(f"journal state {self.state!r} is not one of {STATES}")

    def to_json(self) -> dict[str, Any]:
        return {"shardify_journal": JOURNAL_VERSION, "version": self.version, "fingerprint": self.fingerprint,
                "options": self.options, "source": self.source, "state": self.state,
                "started_s": self.started_s, "updated_s": self.updated_s, "published_s": self.published_s,
                "retired_s": self.retired_s, "manifest_fingerprint": self.manifest_fingerprint,
                "error": self.error}

    @classmethod
    def from_json(cls, doc: Any, *, where: str) -> JournalHead:
        if not isinstance(doc, dict) or doc.get("shardify_journal") != JOURNAL_VERSION:
            raise ManifestError(f"{where}: not a shardify journal of version {JOURNAL_VERSION}")
        why = damage(doc, _HEAD_FIELDS)
        try:
            if why is not None:
                raise ValueError(why)
            return cls(**{k: doc[k] for k in doc if k != "shardify_journal"})
        except (TypeError, ValueError) as exc:
            raise ManifestError(f"{where}: malformed journal ({exc}); restore it, or remove its version's folder "
                                "to give up that write (`shardify gc` then deletes what it left)") from None


_SECONDS = typed(float, optional=True)
_HEAD_FIELDS = {"version": typed(str), "fingerprint": typed(str), "options": typed(dict, optional=True),
                "source": typed(str, optional=True), "state": typed(str, optional=True), "started_s": _SECONDS,
                "updated_s": _SECONDS, "published_s": typed(float, None, optional=True),
                "retired_s": typed(float, None, optional=True),
                "manifest_fingerprint": typed(str, None, optional=True), "error": typed(str, optional=True)}


def batch_name(version: str, number: int) -> str:
    return f"{journal_dir(version)}/shards-{number:06d}.json"


def named_paths(rows: Iterable[Mapping[str, Any]]) -> set[str]:
    """Every object path a list of manifest rows names (shard, index)."""
    out: set[str] = set()
    for row in rows:
        for key in ("path", "index_path"):
            if row.get(key):
                out.add(str(row[key]))
    return out


def _stem(rel: str) -> str:
    """`shards/shard-000042.` for the shard, its index and its sidecars (`.sources.json`) alike."""
    head, _, name = rel.rpartition("/")
    return f"{head}/{name.split('.', 1)[0]}." if head else f"{name.split('.', 1)[0]}."


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredObject:
    """One object of a listing: its path below the prefix, size and modification time (epoch s)."""

    path: str
    size: int
    mtime_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class VersionFacts:
    """What gc knows of one version: its journal head (None: a legacy version) and the paths it names."""

    head: JournalHead | None
    paths: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True, slots=True)
class GcPlan:
    """What gc deletes, and why the rest stays."""

    delete: tuple[str, ...]
    kept_current: int
    kept_protected: int  # named by a live journal or a version retired less than the grace ago
    kept_young: int  # unlisted, but younger than the grace
    foreign: tuple[str, ...]  # not shardify's: never touched


def _owner(rel: str, stems: Mapping[str, str], parts: Mapping[str, str]) -> str | None:
    """The version an object belongs to: by its version directory, a named stem or a parts directory."""
    m = _VERSION_DIR.match(rel)
    if m:
        return m.group(1)
    owner = stems.get(_stem(rel))
    if owner is None and rel.startswith(f"{PARTS_DIR}/"):
        owner = parts.get(rel.split("/", 2)[1])
    return owner


def plan_gc(
    objects: Sequence[StoredObject], *, current_paths: frozenset[str], current_parts_dir: str | None,
    current_published_s: float | None, current_version: str | None, versions: Mapping[str, VersionFacts],
    now_s: float, grace_s: float,
) -> GcPlan:
    """Decide what gc deletes from a listing; pure (the caller lists, reads journals, deletes).

    Kept: the lease; the manifest and what it names (indexes and sidecars by stem, its parts directory, its
    journal); everything of a live write or of a version retired less than `grace_s` ago;
    anything younger than the grace; objects of no known version while the current manifest is
    younger than the grace (they may belong to the version it just retired); anything outside
    shardify's namespaces. Deleted: the rest.
    """
    if grace_s < 0:
        raise ValueError("the grace period must be >= 0 seconds")
    cur_stems = {_stem(p) for p in current_paths}
    cur_dirs = tuple([f"{journal_dir(current_version)}/"] if current_version else []) + (
        (current_parts_dir.rstrip("/") + "/",) if current_parts_dir else ())
    stems: dict[str, str] = {}
    parts: dict[str, str] = {}
    for version, facts in versions.items():
        stems.update((_stem(p), version) for p in facts.paths)
        if facts.head is not None and facts.head.manifest_fingerprint:
            parts[facts.head.manifest_fingerprint] = version
    protected = {v for v, f in versions.items() if _protected(f, current_published_s, now_s, grace_s)}
    just_retired = current_published_s is not None and now_s - current_published_s < grace_s
    delete, foreign = [], []
    kept_current = kept_protected = kept_young = 0
    for obj in objects:
        rel = obj.path
        if not is_own(rel):
            foreign.append(rel)
            continue
        if rel == LEASE_NAME:
            continue  # a writer's or this gc's: never deleted, never counted
        if rel == MANIFEST_NAME or rel.startswith(cur_dirs) or _stem(rel) in cur_stems:
            kept_current += 1
            continue
        owner = _owner(rel, stems, parts)
        if owner == current_version and owner is not None:
            kept_current += 1
        elif owner in protected or (owner not in versions and just_retired and not is_temporary(rel)):
            kept_protected += 1
        elif now_s - obj.mtime_s < grace_s:
            kept_young += 1
        else:
            delete.append(rel)
    return GcPlan(delete=tuple(delete), kept_current=kept_current, kept_protected=kept_protected,
                  kept_young=kept_young, foreign=tuple(foreign))


def _protected(facts: VersionFacts, current_published_s: float | None, now_s: float, grace_s: float) -> bool:
    """A live write, or a version retired less than the grace ago (unknown retirement: the current
    manifest's publication, the latest it can have been)."""
    head = facts.head
    if head is None:
        return current_published_s is None or now_s - current_published_s < grace_s
    if head.state == "writing":
        return now_s - head.updated_s < grace_s
    if head.state == "published":
        retired = head.retired_s if head.retired_s is not None else current_published_s
        return retired is None or now_s - retired < grace_s
    return False  # failed: its objects go once they are older than the grace


# --- I/O: the journal on a Store ------------------------------------------------------------


def write_head(store: Store, head: JournalHead) -> None:
    """Publish a journal head atomically (confirmed by the store like every write)."""
    store.write_bytes(f"{journal_dir(head.version)}/{JOURNAL_HEAD}",
                      json.dumps(head.to_json(), separators=(",", ":")).encode())


def read_journal(store: Store, version: str, listing: Sequence[str]) -> tuple[JournalHead, list[dict[str, Any]]]:
    """A journal's head and its published shard rows, in publish order."""
    base = journal_dir(version)
    where = store.url_of(f"{base}/{JOURNAL_HEAD}")
    try:
        head = JournalHead.from_json(json.loads(store.read(f"{base}/{JOURNAL_HEAD}")), where=where)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{where}: not valid JSON ({exc})") from None
    rows: list[dict[str, Any]] = []
    for rel in sorted(p for p in listing if p.startswith(f"{base}/shards-") and p.endswith(".json")):
        try:
            rows += json.loads(store.read(rel))["shards"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            raise ManifestError(f"{store.url_of(rel)}: malformed journal batch ({exc})") from None
    return head, rows


def journal_versions(listing: Iterable[str]) -> list[str]:
    """Versions that have a journal head in a listing, oldest first."""
    out = []
    for rel in listing:
        parts = rel.split("/")
        if len(parts) == 3 and parts[0] == VERSIONS_DIR and parts[2] == JOURNAL_HEAD and _VERSION.match(parts[1]):
            out.append(parts[1])
    return sorted(out, key=generation_of)


class Journal:
    """The journal a running write keeps: its head, and batches of confirmed shards flushed every
    `flush_every_s` (and at the end), so the files written grow with the shards, not their square."""

    def __init__(self, store: Store, head: JournalHead, *, flush_every_s: float = 2.0, num_batches: int = 0,
                 before_flush: Callable[[], None] | None = None, clock: Callable[[], float] = time.time) -> None:
        # num_batches: the batches a resumed write's journal holds already (the next one follows them);
        # before_flush: called before a batch is recorded, to make its shards durable first.
        self.store, self.head, self.flush_every_s, self.clock = store, head, flush_every_s, clock
        self.before_flush = before_flush
        self.pending: list[dict[str, Any]] = []
        self.num_batches = num_batches
        self.last_flush_s = clock()

    def start(self) -> None:
        now = self.clock()
        self.head = replace(self.head, state="writing", started_s=now, updated_s=now)
        write_head(self.store, self.head)

    def add(self, row: Mapping[str, Any]) -> None:
        """Record one shard the store confirmed; flushed with the next batch."""
        self.pending.append(dict(row))
        if self.clock() - self.last_flush_s >= self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        if self.before_flush is not None:
            self.before_flush()  # a shard the journal names must survive a power cut
        body = json.dumps({"shards": self.pending}, separators=(",", ":"), default=list).encode()
        self.store.write_bytes(batch_name(self.head.version, self.num_batches), body)
        self.num_batches += 1
        self.pending = []
        self.last_flush_s = self.clock()
        self.head = replace(self.head, updated_s=self.last_flush_s)
        write_head(self.store, self.head)

    def finish(self, *, manifest_fingerprint: str) -> None:
        """After the manifest is published: the head says so."""
        self.flush()
        now = self.clock()
        self.head = replace(self.head, state="published", updated_s=now, published_s=now,
                            manifest_fingerprint=manifest_fingerprint)
        write_head(self.store, self.head)

    def fail(self, error: str) -> None:
        self.head = replace(self.head, state="failed", updated_s=self.clock(), error=error[:500])
        write_head(self.store, self.head)


# --- Upload sessions: GCS resumable uploads a write opened (dataio/storage/gcs_resumable.py) ----------

SESSIONS_VERSION = 1
SESSIONS_DIR = "sessions"  # versions/v00000g/sessions/<random>.json: one record per open session


@dataclass(frozen=True, kw_only=True, slots=True)
class JournalSessions:
    """Records a version's open upload sessions beside its journal, one small object each, written before
    the upload's first byte and removed when it completes; what is left, gc cancels. Picklable: sent to
    worker processes with the Store. (Journals written before these records existed simply have none.)"""

    version: str

    def record(self, store: Store, rel: str, uri: str) -> str:
        name = f"{journal_dir(self.version)}/{SESSIONS_DIR}/{uuid.uuid4().hex}.json"
        body = {"shardify_session": SESSIONS_VERSION, "path": rel, "uri": uri, "started_s": time.time()}
        store.write_bytes(name, json.dumps(body, separators=(",", ":")).encode())
        return name

    def forget(self, store: Store, handle: str) -> None:
        store.remove(handle)


def session_records(version: str, listing: Iterable[str]) -> list[str]:
    """The session records of `version` in a listing."""
    base = f"{journal_dir(version)}/{SESSIONS_DIR}/"
    return sorted(rel for rel in listing if rel.startswith(base) and rel.endswith(".json"))


def read_session(store: Store, rel: str) -> tuple[str, str]:
    """(object path, session URI) of a session record; ManifestError naming it when it is not one."""
    try:
        doc = json.loads(store.read(rel))
        if doc.get("shardify_session") != SESSIONS_VERSION:
            raise ValueError(f"not a session record of version {SESSIONS_VERSION}")
        return str(doc["path"]), str(doc["uri"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ManifestError(f"{store.url_of(rel)}: malformed upload session record ({exc})") from None


def is_live_write(head: JournalHead, now_s: float, grace_s: float) -> bool:
    """A write that may still be running: its head says writing and moved within the grace."""
    return head.state == "writing" and now_s - head.updated_s < grace_s
