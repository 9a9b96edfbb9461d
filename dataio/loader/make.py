"""make_loader: the one entry point, its keyword options derived from LoaderConfig, and the one
place the loader reads torch.distributed (rank and world size when not given).

Every loader option and its default is written once, as a LoaderConfig field (grouped by concern;
rank, world_size and num_workers, which build the Topology, are make_loader's own); make_loader's
runtime signature (inspect.signature, help()) and the option list in its docstring are made from
LoaderConfig's flat view (LoaderConfig.options()), and an unknown option is refused naming the
closest one.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Sequence
from typing import Any

import torch

from dataio.loader.config import LoaderConfig, Source, check_int
from dataio.loader.kinds import KindsLoader, source_kinds
from dataio.loader.mixing import as_sources
from dataio.loader.shard_loader import ShardLoader
from dataio.plan.schedule import Schedule
from dataio.plan.types import Topology

_OPTIONS = {o.name: o for o in LoaderConfig.options()}
_TOPOLOGY = ("rank", "world_size", "num_workers")  # make_loader's own: they build the Topology


def make_loader(url: str | Sequence[str | Source], *, weights: Sequence[float] | Schedule | None = None,
                rank: int | None = None, world_size: int | None = None, num_workers: int = 2,
                **options: Any) -> ShardLoader:
    """Open the dataset at `url` and return a ShardLoader; batch_size is per rank.

    Several URLs (with `weights`, or Source objects with weight= or repeat=) make a mixture: one
    epoch of `epoch_samples` (default: the sources' sizes summed) split between the sources by
    weight, and each batch's "source" tensor says where every sample came from (plan/mix.py);
    `label_space` gives their labels one space ("same", "union" or a map: loader/labels.py).
    rank and world_size (both or neither) default to torch.distributed's when its default group is
    initialised, else (0, 1); num_workers plan workers read in worker processes or reader threads
    (0: in this process). These three build the Topology; every other keyword is a LoaderConfig
    field (listed below, with its default). With seq_len, a token dataset (or a mixture of them,
    weights as token shares) gives batches of packed sequences instead, through the same loader.
    Sources of different kinds (samples, image-text pairs read with context_length, tokens read with
    seq_len) make a KindsLoader: each batch of one kind, tagged batch["kind"] (loader/kinds.py).
    """
    if isinstance(weights, Schedule):  # weights that change over the run (plan/schedule.py)
        options, weights = {**options, "mix_schedule": weights.pieces}, None
    config = LoaderConfig.from_options(**checked_options(options))
    topology, kv_store = job_topology(rank=rank, world_size=world_size, num_workers=num_workers)
    sources = as_sources(url, weights)
    if len(sources) > 1 and (config.seq_len is not None or config.context_length is not None):
        kinds = source_kinds(sources, config)  # tokens, pairs and samples: one kind per batch (loader/kinds.py)
        if len(set(kinds)) > 1:
            return KindsLoader(sources, kinds, config, topology=topology, num_workers=num_workers,
                               kv_store=kv_store).start()  # type: ignore[return-value]
    loader = ShardLoader(sources, config, topology=topology, num_workers=num_workers, kv_store=kv_store)
    return loader.start()  # what the execution plan starts early (early_start)


def checked_options(options: dict[str, Any]) -> dict[str, Any]:
    """`options` if every key is a LoaderConfig option; TypeError naming the closest one otherwise."""
    for name in options:
        if name not in _OPTIONS:
            close = difflib.get_close_matches(name, [*_OPTIONS, "weights", *_TOPOLOGY], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "; LoaderConfig lists every option"
            raise TypeError(f"make_loader() got an unknown option {name!r}{hint}")
    return options


def job_topology(*, rank: int | None, world_size: int | None, num_workers: int) -> tuple[Topology, Any]:
    """(topology, key-value store for the ranks' start-up agreement, or None): the one place the
    loader reads torch.distributed.

    rank and world_size are used when given, else those of the initialised default process group,
    else (0, 1); the plan has max(1, num_workers) workers. The ranks agree on the dataset through
    the group's store only when this loader is its process's rank of that group.
    """
    check_int("num_workers", num_workers, minimum=0)
    if (rank is None) != (world_size is None):
        raise ValueError("give both rank and world_size, or neither (then torch.distributed decides)")
    dist = torch.distributed
    initialised = dist.is_available() and dist.is_initialized()
    if world_size is not None:
        check_int("world_size", world_size, minimum=1)
        check_int("rank", rank, minimum=0)
        if rank >= world_size:  # type: ignore[operator]
            raise ValueError(f"rank {rank} must be below world_size {world_size}")
        rank, world_size = int(rank), int(world_size)  # type: ignore[arg-type]
        in_group = initialised and (rank, world_size) == (dist.get_rank(), dist.get_world_size())
    elif initialised:
        rank, world_size, in_group = dist.get_rank(), dist.get_world_size(), True
    else:
        rank, world_size, in_group = 0, 1, False
    topology = Topology(rank=rank, world_size=world_size, num_workers=max(1, num_workers))
    if not (in_group and world_size > 1):
        return topology, None
    from torch.distributed import distributed_c10d

    return topology, distributed_c10d._get_default_store()


def _derive_signature() -> None:
    """make_loader's signature and the option list of its docstring, from LoaderConfig's fields."""
    params = list(inspect.signature(make_loader).parameters.values())[:5]  # url, weights, the Topology's
    lines = []
    for o in LoaderConfig.options():
        required = o.default is dataclasses.MISSING
        default = inspect.Parameter.empty if required else o.default
        params.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=o.type))
        lines.append(f"    {o.name}: {_type_name(o.type)}" + ("  (required)" if required else f" = {o.default!r}")
                     + f"  -- {o.help}")
    signature = inspect.Signature(params, return_annotation="ShardLoader")
    make_loader.__signature__ = signature  # type: ignore[attr-defined]
    make_loader.__doc__ = f"{make_loader.__doc__.rstrip()}\n\n    Options (LoaderConfig):\n\n" + "\n".join(lines) + "\n"


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


_derive_signature()
