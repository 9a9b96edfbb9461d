"""Where this process sits in the job (read once from torchrun's environment) and the process group.

The trainer is the one place that reads RANK / WORLD_SIZE / LOCAL_RANK; everything below it
gets rank and world_size as arguments.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.rendezvous import rendezvous

from trainer.heartbeat import Heartbeat, Watch, is_local


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
    if not silent:
        return None
    ranks = ", ".join(str(r) for r in silent)
    w = rt.heartbeat.watch
    return (f"rank {ranks} stopped responding (no heartbeat for {w.watch_s:g} s{_where(rt.heartbeat, silent)}); "
            f"the collective waiting for it gave up {w.watch_s + w.slack_s:g} s before --dist-timeout-s "
            f"({w.timeout_s:g} s) to name it within it ({first})")


def _where(hb: Heartbeat, ranks: list[int]) -> str:
    """Where the lost ranks run, and which of them this rank ends as it exits (see `stop`)."""
    parts = []
    for r in ranks:
        proc = hb.lost.get(r)
        if proc is not None:
            mine = is_local(proc, hb.me)
            parts.append(f"rank {r} is {proc.where()}" + (", ended by this rank as it exits" if mine else ""))
    return "; " + "; ".join(parts) if parts else ""


def stop(rt: Runtime | None) -> None:
    """Leave the job. After a rank was declared lost (`name_unresponsive`): end the lost ranks that run
    on this machine (torchrun's SIGTERM cannot end a stopped process, and torch 2.13 sends its SIGKILL
    only 30 s later, whatever --shutdown-timeout says), and leave the process group without tearing it
    down (no more waiting on the lost peer); the caller exits right after."""
    if rt is None:
        return
    lost = rt.heartbeat is not None and bool(rt.heartbeat.lost)
    if rt.heartbeat is not None:
        rt.heartbeat.stop()
        if lost:
            rt.heartbeat.end_lost()
    if rt.distributed and dist.is_initialized() and not lost:
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
