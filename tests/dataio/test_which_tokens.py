"""`which` for token runs against what the token loader delivered: every sequence of every step of a run that
resumed 2 ranks -> 3 ranks (2 workers, another grad_accum) and into a second epoch, named by documents and
token ranges; one dataset (concat and aligned packing) and a mixture; loaders in one process."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dataio import make_loader
from dataio.format.manifest import read_manifest
from dataio.loader.which import run_which, samples_of_step, sidecar_doc
from dataio.plan.schedule import Piece, Schedule
from dataio.plan.types import Segment
from dataio.readers.token_shards import TokenShards
from dataio.storage.store import Store
from tests.dataio.tokengen import write_token_dataset

pytestmark = pytest.mark.timeout(120)
A_DOCS = [[5, 1, 40, 3], [], [70], [2, 2, 9, 33, 1, 12], [25, 61, 4]] * 3
B_DOCS = [[9, 30, 2], [44, 1, 7]] * 3
SEQ_LEN, B = 8, 2


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> tuple[str, str]:
    a, b = (str(tmp_path_factory.mktemp(n) / "ds") for n in ("ta", "tb"))
    write_token_dataset(Store(a), A_DOCS, block_tokens=16)
    write_token_dataset(Store(b), B_DOCS, block_tokens=16, first_id=100_000)
    return a, b


def _loaders(url, world_size, num_workers, *, packing, weights=None, state=None, grad_accum=1):
    loaders = [make_loader(url, weights=weights, seq_len=SEQ_LEN, batch_size=B, packing=packing,
                           num_workers=num_workers, rank=r, world_size=world_size, shuffle_window=3, seed=4)
               for r in range(world_size)]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
        loader.history.grad_accum = grad_accum
    return loaders


def _train(loaders, steps, grad_accum, recorded, *, epoch):
    """`steps` optimizer steps on every rank in lockstep; recorded[step][rank] = its batches' rows."""
    its = []
    for loader in loaders:
        loader.set_epoch(epoch)
        its.append(iter(loader))
    for _ in range(steps):
        recorded[len(recorded) + 1] = {r: [next(it) for _ in range(grad_accum)] for r, it in enumerate(its)}
    for it in its:
        it.close()


def _tokens(seq, readers) -> list[int]:
    """The tokens the sequence's named ranges hold, read from the shards."""
    out: list[int] = []
    for r in seq.ranges:
        shards = readers[r.dataset]
        j = shards.manifest.shard_paths.index(r.shard)
        first = int(shards.offsets(j)[r.document])
        out += shards.read(Segment(shard=j, start=first + r.start, stop=first + r.end)).tokens.tolist()
    return out


@pytest.mark.parametrize("packing,mixed", [("concat", None), ("aligned", None), ("concat", "weights"),
                                          ("concat", "schedule")])
def test_which_names_every_sequence_of_a_resumed_token_run(datasets, packing, mixed):
    weights = {None: None, "weights": [3.0, 1.0], "schedule": Schedule((Piece((0.8, 0.2), 20), Piece((0.2, 0.8))))}
    url, weights = (list(datasets), weights[mixed]) if mixed else (datasets[0], None)
    recorded: dict[int, dict[int, list[dict]]] = {}
    first = _loaders(url, 2, 0, packing=packing, weights=weights)
    _train(first, 3, 1, recorded, epoch=0)
    second = _loaders(url, 3, 2, packing=packing, weights=weights, state=first[0].state_dict(), grad_accum=2)
    _train(second, 2, 2, recorded, epoch=0)
    _train(second, 1, 2, recorded, epoch=1)  # a second pass in the history
    urls = list(datasets) if mixed else [datasets[0]]
    doc = json.loads(sidecar_doc(step=len(recorded), epoch=1, grad_accum=2, sources=[(u, None) for u in urls],
                                 loader_state=second[0].state_dict()))
    readers = {Store(u).url: TokenShards(Store(u), read_manifest(Store(u))) for u in urls}
    for step, per_rank in recorded.items():
        seqs = samples_of_step(doc, step)
        for r, batches in per_rank.items():
            mine = [s for s in seqs if s.rank == r]
            assert len(mine) == B * len(batches), step
            for s in mine:
                batch = batches[s.micro]
                row, n = batch["input_ids"][s.row], s.num_tokens
                assert _tokens(s, readers) == row[:n].tolist(), (step, r, s)
                assert int(batch["loss_mask"][s.row].sum()) == (0 if s.is_pad else n)
                assert s.is_pad == (not bool(batch["mask"][s.row]))
                if "doc_ids" in batch:  # the named documents are the row's documents
                    assert len(s.ranges) == len(set(batch["doc_ids"][s.row][:n].tolist()))


def test_which_prints_token_ranges_and_refuses_export(datasets, tmp_path):
    recorded: dict[int, dict[int, list[dict]]] = {}
    loaders = _loaders(datasets[0], 1, 0, packing="concat")
    _train(loaders, 2, 1, recorded, epoch=0)
    doc = sidecar_doc(step=2, epoch=0, grad_accum=1, sources=[(datasets[0], None)],
                      loader_state=loaders[0].state_dict())
    (tmp_path / "s.loader-state.json").write_bytes(doc)

    class Args:
        run, step, rank, json, export = str(tmp_path / "s.loader-state.json"), 2, None, True, None

    rows = [json.loads(x) for x in run_which(Args(), None)]
    assert len(rows) == B and all(r["ranges"] and r["num_tokens"] == SEQ_LEN + 1 for r in rows)
    assert {"shard", "document", "start", "end", "source"} <= set(rows[0]["ranges"][0])
    keys = [s.key for s in samples_of_step(json.loads(doc), 2)]  # what spikes.jsonl names
    assert len(keys) == B and all(k.startswith("shards/shard-") and "#" in k and "[" in k for k in keys)
    Args.export, Args.json = str(tmp_path / "x"), False
    with pytest.raises(ValueError, match="token ranges"):
        run_which(Args(), None)
