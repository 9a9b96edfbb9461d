"""Naming a rank that stopped responding, and ending it where torchrun cannot.

Every rank bumps a counter in the job's key-value store a few times a second and publishes where
its process runs. When a collective times out, the counters tell which ranks stopped; the job then
ends. torchrun ends a failed job by sending SIGTERM to every rank and SIGKILL after a grace period,
but a stopped process (SIGSTOP, a frozen cgroup) does not act on SIGTERM until it is continued,
and torch 2.13's agent waits a fixed 30 s there whatever --shutdown-timeout says (its
`_stop_workers` passes no timeout; pytorch/pytorch#192815). So a survivor ends a lost rank that
runs on its own machine itself, once it has named it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class Watch:
    """How --dist-timeout-s is spent when a rank stops: collectives give up after `collective_s`,
    then the heartbeats are watched for `watch_s`, so the rank is named within the user's timeout
    (`slack_s` is left for the failure to reach Python and the message to be written)."""

    timeout_s: float  # --dist-timeout-s, the user's promise
    collective_s: float
    watch_s: float
    slack_s: float

    @property
    def every_s(self) -> float:
        """Seconds between a rank's heartbeats: four fall in one watch."""
        return max(0.05, self.watch_s / 4)

    @classmethod
    def for_timeout(cls, timeout_s: float) -> Watch:
        watch_s = min(2.0, timeout_s / 8)
        slack_s = min(2.0, timeout_s / 8)
        return cls(timeout_s=timeout_s, collective_s=timeout_s - watch_s - slack_s, watch_s=watch_s, slack_s=slack_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class Proc:
    """Where a rank's process runs: enough to signal it from the same machine, and nothing else.

    A pid alone could name another process (pid reuse, another pid namespace on the same host), so
    the machine's boot id, the pid namespace and the process's start time (in clock ticks since
    boot, /proc/PID/stat) must all match before a signal is sent."""

    host: str
    boot_id: str
    pid_ns: str
    pid: int
    start_ticks: int

    def where(self) -> str:
        return f"pid {self.pid} on {self.host}"


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (after the parenthesized command name); None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
        return int(text[text.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def this_proc() -> Proc | None:
    """This process, or None where /proc does not say enough (not Linux): then nobody signals it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    ticks = _start_ticks(os.getpid())
    if ticks is None:
        return None
    return Proc(host=socket.gethostname(), boot_id=boot_id, pid_ns=pid_ns, pid=os.getpid(), start_ticks=ticks)


def is_local(other: Proc, me: Proc | None) -> bool:
    """Whether `other` is another process this one can signal: same machine, boot and pid namespace."""
    return (me is not None and other.pid != me.pid and (other.host, other.boot_id, other.pid_ns)
            == (me.host, me.boot_id, me.pid_ns))


def kill(other: Proc) -> bool:
    """SIGKILL `other` if that pid is still the same process (checked through a pidfd where there is one)."""
    fd = None
    try:
        if hasattr(os, "pidfd_open"):
            fd = os.pidfd_open(other.pid)  # from here on the fd names this process, whatever the pid becomes
        if _start_ticks(other.pid) != other.start_ticks:
            return False  # gone, or the pid now belongs to another process
        if fd is not None:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(other.pid, signal.SIGKILL)
        return True
    except OSError:  # gone already (ESRCH), or not ours to signal (EPERM)
        return False
    finally:
        if fd is not None:
            os.close(fd)


class Heartbeat:
    """Every rank bumps a counter of its own in the job's key-value store a few times a second.

    When a collective times out the counters tell which ranks stopped: a rank that is stopped
    (SIGSTOP), hung in native code or gone leaves its counter still, while a rank merely waiting
    in the same collective keeps beating. Under torchrun the store is the agent's, so it still
    answers when a rank does not. Collectives time out `Watch.watch_s + Watch.slack_s` before
    --dist-timeout-s, so the check ends, and the rank is named, within it.
    """

    def __init__(self, kv: Any, *, rank: int, world_size: int, watch: Watch) -> None:
        self.kv, self.rank, self.world_size, self.watch = kv, rank, world_size, watch
        self.me = this_proc()
        self.lost: dict[int, Proc | None] = {}  # ranks declared lost, and where they run (None: unknown)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Heartbeat:
        if self.me is not None:
            self.kv.set(f"proc/{self.rank}", json.dumps(asdict(self.me)))
        self._thread = threading.Thread(target=self._beat, name=f"trainer-heartbeat-{self.rank}", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.is_set():
            try:
                self.kv.add(f"heartbeat/{self.rank}", 1)
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending anyway
                return
            self._stop.wait(self.watch.every_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def silent_ranks(self) -> list[int] | None:
        """Other ranks whose counter did not move during watch_s, now in `lost` with where they run;
        None if the store itself did not answer."""
        result: list[list[int]] = []

        def read() -> None:
            keys = [f"heartbeat/{r}" for r in range(self.world_size)]
            before = [int(self.kv.add(k, 0)) for k in keys]
            time.sleep(self.watch.watch_s)
            after = [int(self.kv.add(k, 0)) for k in keys]
            silent = [r for r in range(self.world_size) if after[r] == before[r] and r != self.rank]
            self.lost.update({r: self._proc_of(r) for r in silent})
            result.append(silent)

        reader = threading.Thread(target=read, name="trainer-heartbeat-check", daemon=True)
        reader.start()
        reader.join(timeout=self.watch.watch_s + self.watch.slack_s)
        return result[0] if result else None

    def _proc_of(self, rank: int) -> Proc | None:
        key = f"proc/{rank}"
        if not self.kv.check([key]):  # get() would wait for a key that a rank without /proc never sets
            return None
        try:
            return Proc(**json.loads(self.kv.get(key)))
        except (TypeError, ValueError):
            return None

    def end_lost(self) -> list[int]:
        """SIGKILL the lost ranks that run on this machine; the ranks ended. Only once the job is ending:
        torchrun's SIGTERM cannot end a stopped process, and its SIGKILL would come 30 s later."""
        return [r for r, proc in sorted(self.lost.items()) if proc is not None and is_local(proc, self.me)
                and kill(proc)]
