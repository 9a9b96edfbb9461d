"""One writer per destination: the lease that `shardify write`, `append`, `--overwrite`, `--resume` and
`gc` hold on a dataset prefix while they change it.

The lease is one small JSON object, `versions/lease.json` (who holds it: host, pid, command, a
random token; when it started; a heartbeat). It is created only where none is
(`Store.create_exclusive`: O_EXCL on local disk, If-None-Match: * on S3), refreshed every 10 s by a
thread while its holder runs, each refresh conditional on the lease being unchanged since the
last (If-Match on S3), and removed at the end, on error and on Ctrl-C alike. A kill -9 leaves it;
it has expired when its heartbeat is more than 60 s old, or at once when its process is gone
from the same host, and then the next command takes it over, again conditionally, so of two
racing takers one wins. A holder that loses its lease (it stalled past the expiry and another
took over) finds out before it records progress or publishes, and stops without doing either.
Where the store cannot make writes conditional (a server that ignores If-None-Match, gs://),
the lease is written, left to settle and read back, and read again before publishing: best effort.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from dataio.errors import ShardifyError
from dataio.format.schema import damage, typed
from dataio.format.versions import LEASE_NAME
from dataio.storage.store import Store

EXPIRY_S = 60.0  # a lease whose heartbeat is older than this has expired
HEARTBEAT_S = 10.0  # how often its holder refreshes it
SETTLE_S = 2.0  # stores without conditional writes: wait this long, then read the lease back


class LeaseError(ShardifyError):
    """The destination is held by another writer, or this one's lease was taken over."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaseInfo:
    """What the lease object says: who holds it, since when, and its last heartbeat (epoch seconds)."""

    host: str
    pid: int
    command: str
    token: str
    started_s: float
    heartbeat_s: float
    beat: int = 0

    def to_bytes(self) -> bytes:
        return json.dumps({"shardify_lease": 1, **asdict(self)}, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes) -> LeaseInfo | None:
        """The lease in `data`; None if it is not one (damaged: treated as expired)."""
        return cls.read(data)[0]

    @classmethod
    def read(cls, data: bytes) -> tuple[LeaseInfo | None, str]:
        """(the lease in `data`, "") or (None, what is damaged: a field of the wrong type counts too)."""
        try:
            doc = json.loads(data)
        except ValueError:
            return None, "it is not JSON"
        why = damage(doc, _FIELDS)
        if why is not None:
            return None, why
        return cls(**{k: doc[k] for k in _FIELDS}), ""

    def describe(self, now_s: float) -> str:
        return (f"`shardify {self.command}` on host {self.host}, process {self.pid}, started "
                f"{_ago(now_s - self.started_s)}, last heartbeat {_ago(now_s - self.heartbeat_s)}")


_FIELDS = {"host": typed(str), "pid": typed(int, ok=lambda v: v >= 1, says=">= 1"), "command": typed(str),
           "token": typed(str), "started_s": typed(float), "heartbeat_s": typed(float),
           "beat": typed(int, ok=lambda v: v >= 0, says=">= 0")}


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def pid_alive(pid: int) -> bool:
    """True while process `pid` runs on this host (a zombie, killed and not yet reaped, has ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def expired_because(info: LeaseInfo | None, now_s: float, *, host: str, expiry_s: float = EXPIRY_S) -> str | None:
    """Why a lease has expired (its heartbeat is too old, its process is gone), None while it holds."""
    if info is None:
        return "it is not readable as a lease"
    if now_s - info.heartbeat_s > expiry_s:
        return f"its last heartbeat was {_ago(now_s - info.heartbeat_s)} (over {expiry_s:.0f} s)"
    if info.host == host and not pid_alive(info.pid):
        return f"process {info.pid} is no longer running on {host}"
    return None


class Lease:
    """The lease on one destination: `with Lease(store, "write --overwrite"):` holds it or raises LeaseError."""

    def __init__(self, store: Store, command: str, *, heartbeat_s: float = HEARTBEAT_S, expiry_s: float = EXPIRY_S,
                 settle_s: float = SETTLE_S) -> None:
        self.store, self.command = store, command
        self.heartbeat_s, self.expiry_s, self.settle_s = heartbeat_s, expiry_s, settle_s
        self.host = socket.gethostname()
        now = time.time()
        self.info = LeaseInfo(host=self.host, pid=os.getpid(), command=command, token=uuid.uuid4().hex,
                              started_s=now, heartbeat_s=now)
        self.tag: str | None = None
        self.took_over = ""  # a note when this lease replaced an expired one
        self.lost = ""  # set when another took the lease over: why
        self.atomic = store.exclusive_is_atomic
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._made_dirs: list[str] = []

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # --- taking it ---------------------------------------------------------------------------

    def acquire(self) -> Lease:
        """Hold the lease (taking over an expired one) and start the heartbeat; LeaseError if it is held."""
        if self.store.is_local:  # what a refused or failed command created, release removes again
            folder = os.path.dirname(self.store.path(LEASE_NAME))
            self._made_dirs = [d for d in (os.path.dirname(folder), folder) if not os.path.isdir(d)]
        try:
            self._take()
            if not self.atomic or self._create_not_exclusive():
                self._settle()
        except BaseException:
            self.release()  # (Ctrl-C between taking and settling: the lease goes too)
            raise
        self._thread = threading.Thread(target=self._heartbeats, name="shardify-lease", daemon=True)
        self._thread.start()
        return self

    def _take(self) -> None:
        body = self.info.to_bytes()
        for _ in range(5):  # a holder may release (or another take over) between two of our calls
            self.tag = self._create(body)
            if self.tag is not None:
                return
            got = self.store.read_tagged(LEASE_NAME)
            if got is None:
                continue
            data, tag = got
            other, damaged = LeaseInfo.read(data)
            if other is not None and other.token == self.info.token:  # our create was applied, its answer lost
                self.tag = tag
                return
            now = time.time()
            why = expired_because(other, now, host=self.host, expiry_s=self.expiry_s)
            if why is None:
                raise LeaseError(self._held_message(other, now))  # type: ignore[arg-type]
            self.tag = self._replace(body, tag)
            if self.tag is not None:
                self.took_over = (f"took over the expired lease of {other.describe(now)}: {why}" if other
                                  else f"took over a damaged lease, {self.store.url_of(LEASE_NAME)} ({damaged})")
                return
        raise LeaseError(f"{self.store.url}: could not take the destination's lease: other commands keep taking "
                         "and releasing it; rerun when they are done")

    def _create(self, body: bytes) -> str | None:
        if self.atomic:
            return self.store.create_tagged(LEASE_NAME, body)
        if self.store.read_tagged(LEASE_NAME) is not None:
            return None
        self.store.write_bytes(LEASE_NAME, body)
        return "unconditional"

    def _replace(self, body: bytes, tag: str) -> str | None:
        if self.atomic:
            return self.store.replace_if(LEASE_NAME, body, tag)
        self.store.write_bytes(LEASE_NAME, body)  # best effort: _settle reads it back
        return "unconditional"

    def _create_not_exclusive(self) -> bool:
        """An object store that ignores If-None-Match creates the lease a second time: then no conditional
        write holds there, and this lease is best effort (read back after a pause, and before publishing)."""
        if self.store.is_local or self.store.protocol == "memory":
            return False
        tag = self.store.create_tagged(LEASE_NAME, self.info.to_bytes())  # the same bytes: nothing changes
        if tag is None:
            return False
        self.atomic, self.tag = False, tag
        return True

    def _settle(self) -> None:
        time.sleep(self.settle_s)
        got = self.store.read_tagged(LEASE_NAME)
        other = LeaseInfo.parse(got[0]) if got else None
        if other is None or other.token != self.info.token:
            raise LeaseError(f"{self.store.url}: another command took the destination at the same time"
                             + (f" ({other.describe(time.time())})" if other else "")
                             + "; this store does not make writes conditional, so the later one yields: rerun "
                               "when it is done")

    def _held_message(self, other: LeaseInfo, now_s: float) -> str:
        resume = ", with --resume to continue its write" if other.command.startswith(("write", "append")) else ""
        return (f"{self.store.url} is held by another command: {other.describe(now_s)}. One command at a time "
                f"changes a destination: wait for that one to finish, then rerun. If it is gone (killed), its "
                f"lease expires {self.expiry_s:.0f} s after its last heartbeat (at once when its process has "
                f"ended on {other.host}); then rerun{resume}")

    # --- keeping it --------------------------------------------------------------------------

    def _heartbeats(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.beat()
            except Exception:  # noqa: BLE001 - a failed refresh is retried at the next beat; expiry is 60 s
                continue

    def beat(self) -> None:
        """Refresh the heartbeat, if the lease is still ours (else note that it was lost)."""
        with self._lock:
            if self.lost or self.tag is None:
                return
            info = replace(self.info, heartbeat_s=time.time(), beat=self.info.beat + 1)
            if not self.atomic:
                self._check_locked()
                self.store.write_bytes(LEASE_NAME, info.to_bytes())
                self.info = info
                return
            tag = self.store.replace_if(LEASE_NAME, info.to_bytes(), self.tag)
            if tag is None:  # changed: by another, or by our own retried write whose first answer was lost
                got = self.store.read_tagged(LEASE_NAME)
                if got is None or LeaseInfo.parse(got[0]) != info:
                    self._lose(got)
                    return
                tag = got[1]
            self.tag, self.info = tag, info

    def check(self) -> None:
        """Raise LeaseError unless this lease is still ours (read from the store: a stalled process
        finds out here, before it records progress or publishes)."""
        with self._lock:
            self._check_locked()

    def _check_locked(self) -> None:
        if not self.lost:
            got = self.store.read_tagged(LEASE_NAME)
            other = LeaseInfo.parse(got[0]) if got else None
            if other is None or other.token != self.info.token:
                self._lose(got)
        if self.lost:
            raise LeaseError(self.lost)

    def _lose(self, got: tuple[bytes, str] | None) -> None:
        other = LeaseInfo.parse(got[0]) if got else None
        whom = other.describe(time.time()) if other else "another command (the lease is gone)"
        self.lost = (f"{self.store.url}: this command's lease on the destination was taken over by {whom} "
                     f"(this process was stalled past the {self.expiry_s:.0f} s expiry); it stops without "
                     "recording or publishing anything more")

    # --- giving it back ----------------------------------------------------------------------

    def release(self) -> None:
        """Stop the heartbeat and remove the lease if it is still ours; a failure leaves it to expire."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            try:
                if not self.lost and self.tag is not None:
                    if self.atomic:
                        self.store.remove_if(LEASE_NAME, self.tag)
                    else:
                        self._check_locked()
                        self.store.remove(LEASE_NAME)
            except Exception:  # noqa: BLE001, S110 - unreachable storage: the lease expires on its own
                pass
            self.tag = None
        self._remove_made_dirs()

    def _remove_made_dirs(self) -> None:
        for directory in reversed(self._made_dirs):
            try:
                os.rmdir(directory)  # only if empty: a write leaves its journal, a refused one nothing
            except OSError:
                break
        self._made_dirs = []

