"""Where this process sits in the job (read once from torchrun's environment) and the process group.

The trainer is the one place that reads RANK / WORLD_SIZE / LOCAL_RANK; everything below it
gets rank and world_size as arguments.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.rendezvous import rendezvous


class SetupFailed(Exception):
    """Some rank could not start; `message` is the first rank's error (printed by rank 0 only)."""

    def __init__(self, message: str, *, failed_rank: int) -> None:
        super().__init__(message)
        self.message, self.failed_rank = message, failed_rank


@dataclass(frozen=True, kw_only=True, slots=True)
class Runtime:
    """This process's place: rank, world size, its device, and whether a process group is up."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    distributed: bool
    node_rank: int = 0  # torchrun's GROUP_RANK: which node (launcher) this rank runs on
    heartbeat: Heartbeat | None = None  # distributed runs only: names a rank that stops responding

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def topology(env: Mapping[str, str]) -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun's variables; (0, 1, 0) without torchrun."""
    try:
        rank, world_size = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
        local_rank = int(env.get("LOCAL_RANK", "0"))
    except ValueError:
        raise ValueError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (set by torchrun)") from None
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK={rank} is outside WORLD_SIZE={world_size}")
    return rank, world_size, local_rank


def pick_device(kind: str, local_rank: int) -> torch.device:
    """One device per LOCAL_RANK: cuda:LOCAL_RANK when CUDA is asked for (or auto and present), else cpu."""
    if kind == "cpu" or (kind == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("--device cuda but CUDA is not available here; use --device cpu")
    if local_rank >= torch.cuda.device_count():
        raise ValueError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs: "
                         "use --nproc_per_node <= the number of GPUs")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def start(*, device: str, timeout_s: float, env: Mapping[str, str] | None = None) -> Runtime:
    """Join the process group (NCCL on CUDA, gloo on CPU) with a short timeout when under torchrun."""
    env = os.environ if env is None else env
    rank, world_size, local_rank = topology(env)
    dev = pick_device(device, local_rank)
    distributed = "MASTER_ADDR" in env and "WORLD_SIZE" in env
    watch = Watch.for_timeout(timeout_s)
    if distributed:
        backend = "nccl" if dev.type == "cuda" else "gloo"
        store, _, _ = next(rendezvous("env://", rank, world_size, timeout=datetime.timedelta(seconds=timeout_s)))
        # After torchrun restarts the group, the store can still hold the dead attempt's addresses;
        # a prefix per attempt keeps the new ranks from connecting to them.
        attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        kv = dist.PrefixStore(f"trainer/attempt-{attempt}", store)
        dist.init_process_group(backend, store=kv, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=watch.collective_s),
                                device_id=dev if dev.type == "cuda" else None)
    node_rank = int(env.get("GROUP_RANK", "0") or 0)
    heartbeat = Heartbeat(kv, rank=rank, world_size=world_size, watch=watch).start() if distributed else None
    return Runtime(rank=rank, world_size=world_size, local_rank=local_rank, device=dev, distributed=distributed,
                   node_rank=node_rank, heartbeat=heartbeat)


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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Heartbeat:
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
        """Ranks whose counter did not move during watch_s; None if the store itself did not answer."""
        result: list[list[int]] = []

        def read() -> None:
            keys = [f"heartbeat/{r}" for r in range(self.world_size)]
            before = [int(self.kv.add(k, 0)) for k in keys]
            time.sleep(self.watch.watch_s)
            after = [int(self.kv.add(k, 0)) for k in keys]
            result.append([r for r in range(self.world_size) if after[r] == before[r]])

        reader = threading.Thread(target=read, name="trainer-heartbeat-check", daemon=True)
        reader.start()
        reader.join(timeout=self.watch.watch_s + self.watch.slack_s)
        return result[0] if result else None


def name_unresponsive(rt: Runtime, exc: BaseException) -> str | None:
    """After a collective failed with `exc`: which ranks stopped responding, in words; None if none can be named."""
    if rt.heartbeat is None:
        return None
    silent = rt.heartbeat.silent_ranks()
    text = str(exc).strip()
    first = text.splitlines()[0][:300] if text else type(exc).__name__
    if silent is None:
        return (f"a collective failed ({first}) and the job's key-value store does not answer either: the "
                "machine hosting torchrun's store, or its network, is down")
    silent = [r for r in silent if r != rt.rank]
    if not silent:
        return None
    ranks = ", ".join(str(r) for r in silent)
    w = rt.heartbeat.watch
    return (f"rank {ranks} stopped responding (no heartbeat for {w.watch_s:g} s); the collective waiting for "
            f"it gave up {w.watch_s + w.slack_s:g} s before --dist-timeout-s ({w.timeout_s:g} s) to name it "
            f"within it ({first})")


def stop(rt: Runtime | None) -> None:
    if rt is not None and rt.heartbeat is not None:
        rt.heartbeat.stop()
    if rt is not None and rt.distributed and dist.is_initialized():
        dist.destroy_process_group()


def gather(rt: Runtime, obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    if not rt.distributed:
        return [obj]
    out: list[Any] = [None] * rt.world_size
    dist.all_gather_object(out, obj)
    return out


def agree(rt: Runtime, error: str | None) -> None:
    """Collective check after setup: if any rank failed, every rank raises SetupFailed (the lowest rank's message)."""
    errors = gather(rt, error)
    for rank, message in enumerate(errors):
        if message is not None:
            raise SetupFailed(message, failed_rank=rank)


def barrier(rt: Runtime) -> None:
    if rt.distributed:
        dist.barrier()


def all_sum(rt: Runtime, values: list[float]) -> list[float]:
    """Element-wise sum over ranks (float64 on the rank's device)."""
    t = torch.tensor(values, dtype=torch.float64, device=rt.device)
    if rt.distributed:
        dist.all_reduce(t)
    return t.tolist()
