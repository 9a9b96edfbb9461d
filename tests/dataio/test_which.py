"""`which` against what the loader delivered, for both kinds of data the one loader reads: every step
of a run that resumed 2 ranks -> 3 ranks (another grad_accum and worker count too) and into a second
epoch, loaders in one process. Samples are named by key; token sequences by documents and token
ranges, checked against the shards. One dataset (tokens: concat and aligned packing), a mixture and
a weight schedule."""

from __future__ import annotations

import json

import pytest

from dataio.errors import StateError
from dataio.format.manifest import read_manifest
from dataio.loader.make import make_loader
from dataio.loader.which import run_which, samples_of_step, sidecar_doc
from dataio.plan.schedule import Piece, Schedule
from dataio.plan.types import Segment
from dataio.readers.token_shards import TokenShards
from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset
from tests.dataio.tokengen import write_token_dataset

pytestmark = pytest.mark.timeout(120)
B, SEQ_LEN = 4, 8
A_DOCS = [[5, 1, 40, 3], [], [70], [2, 2, 9, 33, 1, 12], [25, 61, 4]] * 3
B_DOCS = [[9, 30, 2], [44, 1, 7]] * 3
SCHEDULES = {"samples": Schedule((Piece((0.7, 0.3), 40), Piece((0.2, 0.8)))),  # the resume: in the first piece
             "tokens": Schedule((Piece((0.8, 0.2), 20), Piece((0.2, 0.8))))}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, tuple[str, str]]:
    a, b, ta, tb = (str(tmp_path_factory.mktemp(n) / "ds") for n in ("a", "b", "ta", "tb"))
    write_tar_dataset(Store(a), [23, 9, 30, 40])
    write_tar_dataset(Store(b), [11, 17], seed=5)
    write_token_dataset(Store(ta), A_DOCS, block_tokens=16)
    write_token_dataset(Store(tb), B_DOCS, block_tokens=16, first_id=100_000)
    return {"samples": (a, b), "tokens": (ta, tb)}


def _loaders(url, world_size, num_workers=0, *, kind="samples", packing="concat", weights=None, state=None,
             grad_accum=1):
    own = (dict(decode=None, seed=3, shuffle_window=8) if kind == "samples"
           else dict(seq_len=SEQ_LEN, packing=packing, shuffle_window=3, seed=4))
    loaders = [make_loader(url, batch_size=B, weights=weights, num_workers=num_workers, rank=r, world_size=world_size,
                           **own) for r in range(world_size)]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
        loader.history.grad_accum = grad_accum
    return loaders


def _train(loaders, steps, grad_accum, recorded, *, epoch):
    """`steps` optimizer steps on every rank in lockstep; recorded[step][rank] = its batches."""
    its = []
    for loader in loaders:
        loader.set_epoch(epoch)
        its.append(iter(loader))
    for _ in range(steps):
        recorded[len(recorded) + 1] = {r: [next(it) for _ in range(grad_accum)] for r, it in enumerate(its)}
    for it in its:
        it.close()


def _doc(urls, loaders, recorded, grad_accum, epoch=0):
    return json.loads(sidecar_doc(step=len(recorded), epoch=epoch, grad_accum=grad_accum,
                                  sources=[(u, None) for u in urls], loader_state=loaders[0].state_dict()))


def _check_samples(samples, per_rank, step) -> None:
    got = {r: [s.key for s in samples if s.rank == r] for r in per_rank}
    assert got == {r: [k for b in batches for k in b["__key__"]] for r, batches in per_rank.items()}, step


def _check_sequences(seqs, per_rank, step, readers) -> None:
    """Each sequence's named token ranges hold the row's tokens; its documents are the row's."""
    for r, batches in per_rank.items():
        mine = [s for s in seqs if s.rank == r]
        assert len(mine) == B * len(batches), step
        for s in mine:
            batch = batches[s.micro]
            row, n = batch["input_ids"][s.row], s.num_tokens
            tokens: list[int] = []
            for part in s.ranges:
                shards = readers[part.dataset]
                j = shards.manifest.shard_paths.index(part.shard)
                first = int(shards.offsets(j)[part.document])
                tokens += shards.read(Segment(shard=j, start=first + part.start, stop=first + part.end)).tokens.tolist()
            assert tokens == row[:n].tolist(), (step, r, s)
            assert int(batch["loss_mask"][s.row].sum()) == (0 if s.is_pad else n)
            assert s.is_pad == (not bool(batch["mask"][s.row]))
            assert len(s.ranges) == len(set(batch["doc_ids"][s.row][:n].tolist()))


@pytest.mark.parametrize("kind,packing,mixed", [
    ("samples", None, "one"), ("samples", None, "mixture"), ("samples", None, "schedule"),
    ("tokens", "concat", "one"), ("tokens", "aligned", "one"), ("tokens", "concat", "mixture"),
    ("tokens", "concat", "schedule"),
])
def test_which_names_every_step_of_a_resumed_run(datasets, kind, packing, mixed):
    pair = datasets[kind]
    weights = {"one": None, "mixture": [0.7, 0.3], "schedule": SCHEDULES[kind]}[mixed]
    url = pair[0] if mixed == "one" else list(pair)
    urls = [pair[0]] if mixed == "one" else list(pair)
    own = dict(kind=kind, packing=packing, weights=weights)
    recorded: dict[int, dict[int, list[dict]]] = {}
    first = _loaders(url, 2, **own)
    _train(first, 3, 1, recorded, epoch=0)  # 3 steps at 2 ranks, grad_accum 1, in process
    second = _loaders(url, 3, 2, state=first[0].state_dict(), grad_accum=2, **own)
    _train(second, 2, 2, recorded, epoch=0)  # 2 steps at 3 ranks of 2 workers, grad_accum 2
    _train(second, 1, 2, recorded, epoch=1)  # a new epoch: a second pass in the history
    doc = _doc(urls, second, recorded, 2, epoch=1)
    readers = {Store(u).url: TokenShards(Store(u), read_manifest(Store(u))) for u in urls} if kind == "tokens" else {}
    for step, per_rank in recorded.items():
        if kind == "samples":
            _check_samples(samples_of_step(doc, step), per_rank, step)
        else:
            _check_sequences(samples_of_step(doc, step), per_rank, step, readers)
    if kind == "samples":
        one = samples_of_step(doc, 4, ranks=[2])
        assert {s.rank for s in one} == {2} and len(one) == 2 * B and all(s.label is not None for s in one)


def test_which_refuses_steps_outside_the_history_and_a_rewritten_dataset(datasets):
    a, b = datasets["samples"]
    recorded: dict[int, dict[int, list[dict]]] = {}
    loaders = _loaders(a, 1)
    _train(loaders, 2, 1, recorded, epoch=0)
    doc = _doc([a], loaders, recorded, 1)
    with pytest.raises(ValueError, match=r"step 3 is outside .*1\.\.2"):
        samples_of_step(doc, 3)
    doc["sources"] = [{"url": b, "weight": None}]
    del doc["xxh3_128"]  # (else refused as changed after it was written: test_which_sidecar.py)
    with pytest.raises(StateError, match="rewritten or appended"):
        samples_of_step(doc, 1)


def test_which_prints_token_ranges_and_refuses_export(datasets, tmp_path):
    a = datasets["tokens"][0]
    recorded: dict[int, dict[int, list[dict]]] = {}
    loaders = _loaders(a, 1, kind="tokens")
    _train(loaders, 2, 1, recorded, epoch=0)
    (tmp_path / "s.loader-state.json").write_text(json.dumps(_doc([a], loaders, recorded, 1)))

    class Args:
        run, step, rank, json, export = str(tmp_path / "s.loader-state.json"), 2, None, True, None

    rows = [json.loads(x) for x in run_which(Args(), None)]
    assert len(rows) == B and all(r["ranges"] and r["num_tokens"] == SEQ_LEN + 1 for r in rows)
    assert {"shard", "document", "start", "end", "source"} <= set(rows[0]["ranges"][0])
    keys = [s.key for s in samples_of_step(_doc([a], loaders, recorded, 1), 2)]  # what spikes.jsonl names
    assert len(keys) == B and all(k.startswith("shards/shard-") and "#" in k and "[" in k for k in keys)
    Args.export, Args.json = str(tmp_path / "x"), False
    with pytest.raises(ValueError, match="token ranges"):
        run_which(Args(), None)
