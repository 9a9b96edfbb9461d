"""`shardify which` / `python -m trainer.which`: the samples behind optimizer step N, from a checkpoint.

Each trainer checkpoint has a `ckpt-STEP.loader-state.json` sidecar (SIDECAR_SUFFIX): the loader
state (with its run history, loader/history.py), the step it was saved at and the data sources.
From it and the sources' manifests, plan/which.py computes every rank's sample ids of step N;
only the shards holding them are read (their index, and the provenance sidecar), to name each
sample's key, label and source path. Library code: the two commands print what this returns.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dataio.errors import ManifestError, StateError
from dataio.format.manifest import Manifest, label_field, read_manifest
from dataio.format.provenance import read_sources
from dataio.loader.history import HISTORY_KEY, loads_history, resolved_grad_accum
from dataio.loader.sidecar import SIDECAR_SUFFIX, checked_sidecar, read_sidecar, resolve_sources, sidecar_doc
from dataio.loader.token_which import StepSequence, is_token_run, saved_mixture, sequences_of_step
from dataio.plan.mix import MixSource, Mixture
from dataio.plan.schedule import Piece, scheduled
from dataio.plan.types import Segment
from dataio.plan.which import HistoryPass, batch_ids, locate_ids, locate_step
from dataio.readers.by_format import make_reader
from dataio.storage.store import StorageOptions, Store

__all__ = ["SIDECAR_SUFFIX", "find_sidecar", "ids_of_steps", "run_which", "samples_of_step", "sidecar_doc"]


def find_sidecar(where: str, storage: StorageOptions | None = None) -> tuple[Store, str]:
    """(store, name) of the sidecar `where` names: the file itself, the one beside a ckpt-*.pt, or
    the newest in a run directory (or its checkpoints/ folder)."""
    base = where.rstrip("/")
    if base.endswith(SIDECAR_SUFFIX) or base.endswith(".pt"):
        folder, _, name = base.rpartition("/")
        name = name[:-3] + SIDECAR_SUFFIX if name.endswith(".pt") else name
        store = Store(folder or ".", storage)
        if not store.exists(name):
            raise StateError(f"{store.url_of(name)} does not exist: checkpoints carry a loader-state sidecar from "
                             "this shardify on; older ones cannot be asked")
        return store, name
    for folder in (base, f"{base}/checkpoints"):
        store = Store(folder, storage)
        names = sorted(n for n in (store.list() if store.prefix_exists() else []) if n.endswith(SIDECAR_SUFFIX))
        if names:
            return store, names[-1]
    raise StateError(f"{where}: no *{SIDECAR_SUFFIX} here or in its checkpoints/ folder; pass a run's --out "
                     "directory, its checkpoint directory or one checkpoint written by this trainer")


@dataclass(frozen=True, kw_only=True)
class StepSample:
    """One sample of a step on one rank, named."""

    rank: int
    micro: int  # which micro-batch of the step (grad_accum)
    key: str
    dataset: str  # the source's (redacted) URL
    shard: str  # the shard's path in the dataset
    position: int  # the sample's number in that shard
    label: int | None
    origin: str | None  # the provenance sidecar's source path (None: the dataset records none)
    is_pad: bool  # a padding repeat (tail="pad"), not a real sample of the step
    members: dict[str, bytes]  # the sample's fields as stored (exported on request)


def samples_of_step(doc: dict[str, Any], step: int, *, ranks: Sequence[int] | None = None,
                    storage: StorageOptions | None = None) -> list[StepSample] | list[StepSequence]:
    """Every requested rank's samples of optimizer step `step` per the sidecar `doc` (a token run's:
    its sequences, each named by document and token range, loader/token_which.py)."""
    doc = resolve_sources(checked_sidecar(doc))
    passes = history_of(doc)
    place = locate_step(passes, step, last_step=int(doc["step"]))
    chosen = passes[place.pass_index]
    stores = [Store(s["url"], storage) for s in doc["sources"]]
    manifests = [read_manifest(st) for st in stores]
    wanted = range(place.world_size) if ranks is None else ranks
    for r in wanted:
        if not 0 <= r < place.world_size:
            raise ValueError(f"rank {r} is outside the {place.world_size} ranks that ran step {step}")
    if is_token_run(manifests):
        return sequences_of_step(doc, chosen, place, stores=stores, manifests=manifests, ranks=wanted)
    data = _plan_data(doc, stores, manifests, chosen.fingerprint)
    reader = _Samples(stores, manifests)
    out = []
    for r in wanted:
        for micro, batch in enumerate(place.batches):
            got = batch_ids(data, config=chosen.plan, epoch=chosen.epoch, before=place.before,
                            world_size=place.world_size, num_workers=place.num_workers, rank=r, batch=batch,
                            skip=place.skip)
            source, shard, position = locate_ids(data, got.ids)
            for s, j, p, pad in zip(source.tolist(), shard.tolist(), position.tolist(), got.is_pad.tolist()):
                out.append(reader.sample(r, micro, s, j, p, pad))
    return out


def history_of(doc: dict[str, Any]) -> tuple[HistoryPass, ...]:
    """The run history of a sidecar document, unknown grad_accums resolved; StateError without one."""
    passes = loads_history(doc["loader"].get(HISTORY_KEY))
    if passes is None:
        raise StateError("this loader state carries no run history (saved by an older shardify); which needs one")
    return tuple(resolved_grad_accum(passes, int(doc.get("grad_accum", 1))))


def ids_of_steps(doc: dict[str, Any], first: int, last: int, storage: StorageOptions | None = None) -> np.ndarray:
    """(n,) int64 sorted global ids of every real (not padding) sample of optimizer steps first..last,
    on every rank that ran them, from a sidecar document: the manifests are read, never a shard."""
    doc = resolve_sources(checked_sidecar(doc))
    passes = history_of(doc)
    stores = [Store(s["url"], storage) for s in doc["sources"]]
    manifests = [read_manifest(st) for st in stores]
    data, out = None, []
    for step in range(first, last + 1):
        place = locate_step(passes, step, last_step=int(doc["step"]))
        chosen = passes[place.pass_index]
        data = _plan_data(doc, stores, manifests, chosen.fingerprint) if data is None else data
        for r in range(place.world_size):
            for batch in place.batches:
                got = batch_ids(data, config=chosen.plan, epoch=chosen.epoch, before=place.before,
                                world_size=place.world_size, num_workers=place.num_workers, rank=r, batch=batch,
                                skip=place.skip)
                out.append(got.ids[~got.is_pad])
    return np.unique(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)


def _plan_data(doc: dict[str, Any], stores: list[Store], manifests: list[Manifest], fingerprint: str) -> Mixture:
    """What the plan replays: the mixture rebuilt from the state's description (a single dataset: a
    mixture of one, which plans as the single-dataset plan)."""
    for store, m in zip(stores, manifests):
        if m.format not in ("tar", "parquet"):
            raise ManifestError(f"{store.url}: a {m.format} dataset; which names image, table and token "
                                "samples only")
    described = saved_mixture(doc["loader"], fingerprint)
    srcs = tuple(MixSource(name=st.url, shard_sizes=list(m.shard_num_samples), weight=d.get("weight"),
                           repeat=d.get("repeat"), fingerprint=m.fingerprint)
                 for st, m, d in zip(stores, manifests, described["sources"], strict=True))
    for st, s, d in zip(stores, srcs, described["sources"]):
        if s.fingerprint != d.get("fingerprint"):
            raise StateError(f"{st.url}: its fingerprint is {s.fingerprint}, the run read {d.get('fingerprint')}: "
                             "the dataset was rewritten or appended since; its samples cannot be named")
    pieces = (described.get("schedule") or {}).get("pieces")
    if pieces:  # a scheduled mixture: its segments follow the pieces the run had
        return scheduled(srcs, [Piece(tuple(p["weights"]), p["samples"]) for p in pieces],
                         int(described["epoch_samples"]))
    return Mixture(sources=srcs, epoch_samples=described["epoch_samples"])


class _Samples:
    """Reads the named samples: one segment each, each shard's index and provenance once."""

    def __init__(self, stores: list[Store], manifests: list[Manifest]) -> None:
        self.stores, self.manifests = stores, manifests
        self.readers = [make_reader(st, m, verify_checksums=True) for st, m in zip(stores, manifests)]
        self.origins: dict[tuple[int, int], list[str] | None] = {}

    def sample(self, rank: int, micro: int, source: int, shard: int, position: int, pad: bool) -> StepSample:
        store, manifest, reader = self.stores[source], self.manifests[source], self.readers[source]
        seg = Segment(shard=shard, start=position, stop=position + 1)
        (sample,) = reader.parse(seg, reader.fetch(seg))
        members = {k: bytes(v) for k, v in sample.items()
                   if not k.startswith("__") and isinstance(v, (bytes, memoryview))}
        return StepSample(rank=rank, micro=micro, key=str(sample["__key__"]), dataset=store.url,
                          shard=manifest.shard_paths[shard], position=position,
                          label=_label(sample.get(label_field(manifest))),
                          origin=self._origin(source, shard, position), is_pad=pad, members=members)

    def _origin(self, source: int, shard: int, position: int) -> str | None:
        if (source, shard) not in self.origins:
            try:
                self.origins[source, shard] = read_sources(self.stores[source], self.manifests[source], shard)
            except ManifestError:
                self.origins[source, shard] = None  # written before provenance: none to name
        found = self.origins[source, shard]
        return None if found is None else found[position]


def _label(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, (bytes, memoryview)):
        text = bytes(value).decode(errors="replace").strip()
        return int(text) if text.lstrip("-").isdigit() else None
    return int(value)


def export(samples: Sequence[StepSample], dest: str) -> str:
    """Write the samples' stored fields as files (dest/rankR/KEY.EXT), or as one small tar shard
    (WebDataset members KEY.EXT) when dest ends with .tar; returns what was written."""
    real = [s for s in samples if not s.is_pad]
    if dest.endswith(".tar"):
        with tarfile.open(dest, "w") as tar:
            for s in real:
                for ext, data in s.members.items():
                    info = tarfile.TarInfo(f"{_stem(s)}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        return dest
    for s in real:
        folder = os.path.join(dest, f"rank{s.rank}")
        os.makedirs(folder, exist_ok=True)
        for ext, data in s.members.items():
            with open(os.path.join(folder, f"{_stem(s)}.{ext}"), "wb") as f:
                f.write(data)
    return dest


def _stem(s: StepSample) -> str:
    """A file name stem unique in an export: the key, prefixed by the micro-batch when grad_accum > 1."""
    return s.key.replace("/", "_") if s.micro == 0 else f"m{s.micro}-{s.key.replace('/', '_')}"


def sequence_lines(sequences: Sequence[StepSequence], *, as_json: bool) -> list[str]:
    """A token run's step: one line (or JSON object) per sequence, naming each document range it holds."""
    out = []
    for s in sequences:
        ranges = [{"dataset": r.dataset, "shard": r.shard, "document": r.document, "start": r.start,
                   "end": r.end, "source": r.origin} for r in s.ranges]
        if as_json:
            out.append(json.dumps({"rank": s.rank, "micro": s.micro, "row": s.row, "num_tokens": s.num_tokens,
                                   "pad": s.is_pad, "ranges": ranges}))
            continue
        out.append(f"  rank {s.rank} micro {s.micro} row {s.row}: {s.num_tokens} tokens"
                   + ("  (padding)" if s.is_pad else ""))
        out += [f"    {r.dataset} {r.shard} document {r.document} tokens {r.start}:{r.end}  {r.origin or '-'}"
                for r in s.ranges]
    return out


def add_which_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `shardify which` and `python -m trainer.which` (one definition for both)."""
    parser.add_argument("run", metavar="RUN_DIR_OR_CHECKPOINT",
                        help="a trainer's --out directory, its checkpoint directory, a ckpt-*.pt or its "
                             "*.loader-state.json sidecar (a directory: its newest checkpoint)")
    parser.add_argument("--step", type=int, required=True, help="the optimizer step to name (1 is the first)")
    parser.add_argument("--rank", type=int, action="append", default=None,
                        help="only this rank (repeat for several); default: every rank that ran the step")
    parser.add_argument("--export", metavar="DIR", default=None,
                        help="also write the samples' stored files to DIR/rankR/KEY.EXT, or to one tar shard "
                             "when DIR ends with .tar")
    parser.add_argument("--json", action="store_true", help="print one JSON line per sample instead of a table")


def run_which(args: argparse.Namespace, storage: StorageOptions | None = None) -> list[str]:
    """The lines the command prints; raises ShardifyError/ValueError with what to do."""
    store, name = find_sidecar(args.run, storage)
    doc = resolve_sources(read_sidecar(store, name), store)
    samples = samples_of_step(doc, args.step, ranks=args.rank, storage=storage)
    lines = [] if args.json else [f"step {args.step} (from {store.url_of(name)}):"]
    if samples and isinstance(samples[0], StepSequence):
        if args.export:
            raise ValueError("--export writes stored sample files; a token run's sequences are token ranges of "
                             "documents: print them (--json) and read the ranges with `shardify inspect --show`")
        return lines + sequence_lines(samples, as_json=args.json)
    for s in samples:
        row = {"rank": s.rank, "micro": s.micro, "key": s.key, "dataset": s.dataset, "shard": s.shard,
               "position": s.position, "label": s.label, "source": s.origin, "pad": s.is_pad}
        lines.append(json.dumps(row) if args.json else
                     f"  rank {s.rank} micro {s.micro}  {s.key}  label {s.label}  {s.dataset} {s.shard}#{s.position}"
                     f"  {s.origin or '-'}" + ("  (padding)" if s.is_pad else ""))
    if args.export:
        lines.append(f"exported {sum(not s.is_pad for s in samples)} samples to {export(samples, args.export)}")
    return lines

