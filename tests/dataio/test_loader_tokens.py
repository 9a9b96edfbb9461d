"""The token loader end to end, every rank in one process: each token's value is its global id, so a
batch says which tokens it carries. Exactly once (every input token with its next-token label once),
equal steps, positions and documents right, resume at another world size and number of workers,
and the bad input it refuses (another tokenizer, seq_len above every document, a corrupt shard)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dataio import make_loader
from dataio.plan.types import PlanState
from dataio.stream.job import Ticket
from dataio.stream.worker import BatchDataset
from dataio.errors import ManifestError, ShardFormatError, StateError
from dataio.storage.store import Store
from tests.dataio.resume_harness import check_resume, check_save_load_state, loader_advance, loader_deliver
from tests.dataio.shardgen import write_tar_dataset
from tests.dataio.tokengen import write_token_dataset

pytestmark = pytest.mark.timeout(120)
# Uneven shards: an empty one, one-token documents (an EOS alone), documents longer than seq_len.
DOCS = [[5, 1, 40, 3], [], [70], [2, 2, 9, 33, 1, 12], [1], [25, 61, 4], [8, 8, 8, 8, 8]] * 3
TOTAL = sum(sum(d) for d in DOCS)
SEQ_LEN, BATCH = 16, 3


@pytest.fixture(scope="module")
def token_url(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("tokens") / "ds")
    write_token_dataset(Store(root), DOCS, block_tokens=16)
    return root


def _doc_starts() -> np.ndarray:
    lengths = [n for shard in DOCS for n in shard]
    return np.concatenate([[0], np.cumsum(lengths)])


def loaders(url: str, world_size: int, num_workers: int, **kw) -> list:
    return [make_loader(url, seq_len=SEQ_LEN, batch_size=BATCH, num_workers=num_workers, rank=r, world_size=world_size,
                        shuffle_window=5, **kw) for r in range(world_size)]


def trained_pairs(batch: dict) -> list[int]:
    """The input tokens of a batch that carry a real next-token label: what a training step learns from."""
    ids, keep = batch["input_ids"], batch["loss_mask"]
    pairs = keep[:, :-1] & keep[:, 1:]
    return ids[:, :-1][pairs].tolist()


def check_batch(batch: dict) -> None:
    """Shapes and dtypes; labels follow inputs within a document; doc_ids and position_ids agree with the ids."""
    starts = _doc_starts()
    ids, pos, docs, keep = batch["input_ids"], batch["position_ids"], batch["doc_ids"], batch["loss_mask"]
    assert ids.shape == pos.shape == docs.shape == keep.shape == (BATCH, SEQ_LEN + 1)
    assert ids.dtype == pos.dtype == docs.dtype == np.int64 or str(ids.dtype) == "torch.int64"
    for r in range(BATCH):
        real = keep[r].numpy() if bool(batch["mask"][r]) else (docs[r] >= 0).numpy()
        row = ids[r].numpy()[real]
        doc = np.searchsorted(starts, row, side="right") - 1
        assert docs[r].numpy()[real].tolist() == doc.tolist()
        new_run = np.concatenate([[True], doc[1:] != doc[:-1]])  # positions restart at the row and each document
        at = np.arange(len(row))
        assert pos[r].numpy()[real].tolist() == (at - np.maximum.accumulate(np.where(new_run, at, 0))).tolist()
        assert (row[new_run][1:] == starts[doc[new_run][1:]]).all(), "a document run inside a row starts at its start"
        same_doc = doc[1:] == doc[:-1]
        assert (row[1:][same_doc] == row[:-1][same_doc] + 1).all(), "a label is the next token of its document"


@pytest.mark.parametrize("packing", ["concat", "aligned"])
@pytest.mark.parametrize("world_size,num_workers", [(1, 0), (2, 2), (3, 1)])
def test_every_token_once_and_equal_steps(token_url, packing, world_size, num_workers) -> None:
    ranks = loaders(token_url, world_size, num_workers, packing=packing)
    per_rank = [list(loader) for loader in ranks]
    assert len({len(b) for b in per_rank}) == 1 and len(per_rank[0]) == len(ranks[0])  # equal steps
    trained = [t for batches in per_rank for b in batches for t in trained_pairs(b)]
    for batches in per_rank:
        for b in batches:
            check_batch(b)
    assert len(trained) == len(set(trained)), "an input token trained twice"
    # Every token but a document's last (aligned) or the stream's last (concat) has a label; only the
    # tail under one global batch of sequences goes missing.
    expected = TOTAL - (sum(len(d) for d in DOCS) if packing == "aligned" else 1)
    assert 0 <= expected - len(trained) < world_size * BATCH * SEQ_LEN


def test_pad_tail_delivers_everything_and_flags_repeats(token_url) -> None:
    per_rank = [list(loader) for loader in loaders(token_url, 2, 1, packing="aligned", tail="pad")]
    trained = [t for batches in per_rank for b in batches for t in trained_pairs(b)]
    assert len(trained) == len(set(trained)) == TOTAL - sum(len(d) for d in DOCS)
    assert not all(bool(b["mask"].all()) for batches in per_rank for b in batches)  # some repeats, masked


@pytest.mark.parametrize("packing", ["concat", "aligned"])
def test_resume_at_another_world_size_and_worker_count(token_url, packing) -> None:
    def make_at(topology):
        return loaders(token_url, topology[0], topology[1], packing=packing)

    deliver = loader_deliver(make_at, lambda b: tuple(trained_pairs(b)))
    advance = loader_advance(make_at)
    got, _ = check_resume(deliver, advance, lambda keys: keys, None, [((2, 2), 2), ((3, 1), 1), ((1, 2), None)])
    uninterrupted = [t for batches in deliver(None, (1, 0)) for b in batches for t in b]
    assert abs(len(got) - len(uninterrupted)) < 3 * BATCH * SEQ_LEN  # tails under one global batch each


def test_save_load_state_replays_the_run(token_url) -> None:
    check_save_load_state(lambda: loaders(token_url, 2, 2), stop=3,
                          summary=lambda b: tuple(b["input_ids"].flatten().tolist()))


def test_input_ids_alone_and_a_state_of_another_seq_len(token_url) -> None:
    (loader,) = loaders(token_url, 1, 0, fields=("input_ids",))
    batch = next(iter(loader))
    assert set(batch) == {"input_ids", "loss_mask", "mask"}
    (other,) = [make_loader(token_url, seq_len=8, batch_size=BATCH, num_workers=0, rank=0, world_size=1)]
    with pytest.raises(StateError, match="same seq_len and packing"):
        other.load_state_dict(loader.state_dict())


@pytest.mark.parametrize("packing", ["concat", "aligned"])
def test_rows_packed_in_chunks_are_the_batches_packed_one_by_one_and_each_the_callers(token_url, packing,
                                                                                       monkeypatch) -> None:
    """Rows are filled and finished several batches at a time (token_stream.CHUNK_BATCHES) and handed out
    as row slices: the same batches as one batch at a time, and a batch kept by the caller and written to
    is not changed by the batches after it, nor changes them."""
    from dataio.stream import token_stream

    def run(chunk: int) -> list[dict]:
        monkeypatch.setattr(token_stream, "CHUNK_BATCHES", chunk)
        (loader,) = loaders(token_url, 1, 0, packing=packing)
        return [{k: v.clone() for k, v in b.items()} for b in loader], list(loader)

    (one, _), (chunked, kept) = run(1), run(8)
    assert len(one) == len(chunked) == len(kept) > 8
    for a, b in zip(one, chunked):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    kept[0]["input_ids"].fill_(-7)  # the caller's rows: writing them touches no other batch
    assert all(torch.equal(a[k], b[k]) for a, b in zip(one[1:], kept[1:]) for k in a)


@pytest.mark.parametrize("packing,tail", [("concat", "drop"), ("aligned", "pad")])
def test_fields_made_by_numpy_are_those_of_the_c_extension(token_url, packing, tail, monkeypatch) -> None:
    """doc_ids and position_ids come from dataio.stream._token_runs where it is built, numpy otherwise: the same
    batches, over epochs (check_batch holds for both)."""
    from dataio.stream import token_stream

    def run() -> list[dict]:
        (loader,) = loaders(token_url, 1, 0, packing=packing, tail=tail)
        out = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            out += list(loader)
        return out

    built = run()
    monkeypatch.setattr(token_stream, "_token_runs", None)
    fallback = run()
    assert len(built) == len(fallback) > 8
    for a, b in zip(built, fallback):
        check_batch(b)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


@pytest.mark.parametrize("pooled", [True, False])
def test_chunks_made_in_process_reuse_only_what_the_caller_let_go(token_url, pooled) -> None:
    """pooled_buffers (the default): a chunk of batches made in this process sits on a StoragePool storage,
    reused once nothing refers to it; a batch the caller holds is never written again."""
    from dataio.stream import slabs

    (loader,) = loaders(token_url, 1, 0, pooled_buffers=pooled)
    held, want, on_pool = None, None, []
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:
            if held is None:
                held, want = batch, {k: v.clone() for k, v in batch.items()}
            storage = batch["doc_ids"].untyped_storage().data_ptr()
            on_pool.append(storage in {s.data_ptr() for s in slabs._POOL._storages})
    assert all(torch.equal(held[k], want[k]) for k in want)
    assert all(on_pool) if pooled else not any(on_pool)


def test_builder_threads_deliver_what_the_interleaved_streams_do(token_url) -> None:
    for packing in ("concat", "aligned"):
        auto, threads = (loaders(token_url, 2, 3, packing=packing, worker_mode=mode, decode=None)
                         for mode in ("auto", "threads"))
        for a, t in zip(auto, threads):
            got_a, got_t = list(a), list(t)
            assert len(got_a) == len(got_t) > 0
            for x, y in zip(got_a, got_t):
                assert all(torch.equal(x[k], y[k]) for k in x) and x.keys() == y.keys()


def test_worker_processes_deliver_what_the_interleaved_streams_do(token_url) -> None:
    """worker_mode="processes": DataLoader workers run the plan workers' streams; the same batches in the same
    order, also after a resume at another world size; the job pickles (the spawn start method)."""
    auto, procs = (loaders(token_url, 2, 2, worker_mode=mode, packing="aligned") for mode in ("auto", "processes"))
    for a, p in zip(auto, procs):
        got_a, got_p = list(a), list(p)
        assert len(got_a) == len(got_p) > 0
        for x, y in zip(got_a, got_p):
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    first = loaders(token_url, 2, 2, worker_mode="processes")
    it = iter(first[0])
    next(it), next(it), next(it)
    state = first[0].state_dict()
    it.close()
    resumed = [loaders(token_url, 3, 3, worker_mode=mode) for mode in ("auto", "processes")]
    for a, p in zip(*resumed):
        a.load_state_dict(state)
        p.load_state_dict(state)
        got_a, got_p = list(a), list(p)
        assert len(got_a) == len(got_p) > 0
        assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(got_a, got_p))
    ticket = Ticket(1, PlanState(epoch=0), 0)
    mine = BatchDataset(pickle.loads(pickle.dumps(auto[0].job)))[ticket]
    theirs = BatchDataset(auto[0].job)[ticket]
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_a_tokenizer_of_another_hash_is_refused(token_url, tmp_path) -> None:
    other = tmp_path / "tokenizer.json"
    other.write_text('{"model": {}}')
    with pytest.raises(ValueError, match=r"tokenized by 'ids' \(xxh3_64:0123456789abcdef\).*pass the dataset's"):
        make_loader(token_url, seq_len=SEQ_LEN, batch_size=BATCH, num_workers=0, tokenizer=str(other))


def test_aligned_seq_len_above_every_document_is_refused(token_url) -> None:
    with pytest.raises(ValueError, match=rf"{token_url}: seq_len 500 is larger than every document.*packing='concat'"):
        make_loader(token_url, seq_len=500, batch_size=1, num_workers=0, packing="aligned")


def test_seq_len_on_an_image_dataset_is_refused(tmp_path) -> None:
    write_tar_dataset(Store(str(tmp_path / "img")), [2])
    with pytest.raises(ManifestError, match="seq_len= reads token datasets.*holds tar shards"):
        make_loader(str(tmp_path / "img"), seq_len=8, batch_size=1, num_workers=0)


@pytest.mark.parametrize("num_workers,mode", [(0, "auto"), (2, "auto"), (2, "processes")])
def test_a_corrupt_shard_names_the_shard_and_document(tmp_path, num_workers, mode) -> None:
    root = tmp_path / "ds"
    write_token_dataset(Store(str(root)), DOCS, block_tokens=16)
    path = root / "shards" / "shard-000003.tokens"
    data = bytearray(path.read_bytes())
    data[2 * 20] ^= 0xFF  # token 20 of the shard: block 1, its 4th document (offsets 0 2 4 13 46)
    path.write_bytes(bytes(data))
    with pytest.raises(ShardFormatError, match=r"shard-000003\.tokens: token block 1 \(document 3 from token 16\)"):
        with make_loader(str(root), seq_len=SEQ_LEN, batch_size=BATCH, num_workers=num_workers,
                         worker_mode=mode) as loader:  # persistent worker processes stop at close()
            for _ in loader:
                pass


def test_a_corrupt_block_fails_the_batch_that_reads_it_not_the_first(tmp_path) -> None:
    """Local shards: each batch checks the blocks of the rows it copies (each block once) before it leaves,
    so the batches before a corrupt block are delivered and the one that copies it raises, naming it."""
    root = tmp_path / "ds"
    write_token_dataset(Store(str(root)), DOCS, block_tokens=16)
    middle = sorted((root / "shards").glob("*.tokens"))[10]  # halfway through (shuffle=False: in order)
    data = bytearray(middle.read_bytes())
    data[0] ^= 0xFF  # its first token
    middle.write_bytes(bytes(data))
    delivered = 0
    with pytest.raises(ShardFormatError, match=rf"{middle.name}: token block 0"):
        with make_loader(str(root), seq_len=SEQ_LEN, batch_size=BATCH, num_workers=0, shuffle=False) as loader:
            for _ in loader:  # one window holds the whole dataset
                delivered += 1
    assert delivered > 0


def test_object_storage_reads_ranged_windows(s3_server, token_url, tmp_path) -> None:
    """The same batches from SeaweedFS as from the local copy (ranged reads of whole checksum blocks),
    also through the disk cache, whose second pass reads nothing from the store."""
    url = f"s3://{s3_server.new_bucket()}/ds"
    store = Store(url, s3_server.options())
    write_token_dataset(store, DOCS, block_tokens=16)
    cache = dict(cache_dir=str(tmp_path / "cache"), cache_limit_bytes=1 << 20)
    for packing, extra in (("concat", {}), ("aligned", cache), ("aligned", cache)):
        kw = dict(seq_len=SEQ_LEN, batch_size=BATCH, num_workers=2, packing=packing, rank=1, world_size=2)
        loader = make_loader(url, storage=s3_server.options(), **kw, **extra)
        remote = [b["input_ids"].tolist() for b in loader]
        local = [b["input_ids"].tolist() for b in make_loader(token_url, **kw)]
        assert remote == local and remote
    # The last pass (its plan workers' streams interleaved in this process): every ranged read a hit.
    stats = loader._get_dataloader().dataset.opened.token_reader.shards[0].cache.stats
    assert stats.hits > 0 and stats.misses == 0


# --- mixtures: weights are token shares -----------------------------------------------------------------
B_DOCS = [[9, 30, 2], [44, 1, 7]]  # a small second source, its token values from 100000 on
B_FIRST = 100_000


@pytest.fixture(scope="module")
def second_url(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("tokens-b") / "ds")
    write_token_dataset(Store(root), B_DOCS, block_tokens=16, first_id=B_FIRST)
    return root


def mixed(token_url: str, second_url: str, world_size: int, num_workers: int, weights=(3.0, 1.0), **kw) -> list:
    return [make_loader([token_url, second_url], weights=list(weights), seq_len=SEQ_LEN, batch_size=BATCH,
                        num_workers=num_workers, rank=r, world_size=world_size, shuffle_window=5, **kw)
            for r in range(world_size)]


def test_mixture_shares_are_token_shares_and_each_source_is_read_once(token_url, second_url) -> None:
    ranks = mixed(token_url, second_url, 2, 2)
    mixture = ranks[0].mixture
    per_rank = [list(loader) for loader in ranks]
    assert len({len(b) for b in per_rank}) == 1
    batches = [b for rank_batches in per_rank for b in rank_batches]
    seqs = np.bincount(np.concatenate([b["source"].numpy() for b in batches]), minlength=2)
    delivered = mixture.epoch(2 * BATCH).counts  # the epoch rounded down to the global batch, shared by weight
    assert seqs.tolist() == delivered.tolist()
    for b in batches:
        ids, src = b["input_ids"], b["source"]
        assert ((ids[src == 1][b["loss_mask"][src == 1]] >= B_FIRST).all() and
                (ids[src == 0][b["loss_mask"][src == 0]] < B_FIRST).all()), "a row holds its own source's tokens"
    trained = [t for b in batches for t in trained_pairs(b)]
    # Each source gives about its share of sequences (seq_len tokens each): 3:1 within one sequence.
    share_a = sum(t < B_FIRST for t in trained) / len(trained)
    assert abs(share_a - delivered[0] / delivered.sum()) < 1 / delivered.sum() + 0.02
    if delivered[1] <= mixture.sources[1].num_samples:  # no pass repeats the small source within an epoch
        assert len(trained) == len(set(trained))


def test_mixture_resumes_at_another_topology(token_url, second_url) -> None:
    def make_at(topology):  # shares near the sizes: no source repeats within the epoch, so keys are unique
        return mixed(token_url, second_url, topology[0], topology[1], weights=(14.0, 1.0))

    deliver = loader_deliver(make_at, lambda b: tuple(zip(b["source"].tolist(), b["input_ids"][:, 0].tolist())))
    got, _ = check_resume(deliver, loader_advance(make_at), lambda keys: keys, None,
                          [((2, 1), 2), ((1, 2), 1), ((3, 2), None)])
    assert {source for source, _ in got} == {0, 1}
    (one,) = mixed(token_url, second_url, 1, 0, weights=(1.0, 1.0))
    with pytest.raises(StateError, match="single-dataset"):
        one.load_state_dict(loaders(token_url, 1, 0)[0].state_dict())


def test_mixture_save_load_state_replays_the_run(token_url, second_url) -> None:
    """The resume harness's save-and-load over a 2-source mixture (the single dataset's is above): one path."""
    check_save_load_state(lambda: mixed(token_url, second_url, 2, 2), stop=3,
                          summary=lambda b: (tuple(b["input_ids"].flatten().tolist()), tuple(b["source"].tolist())))


def test_sources_of_different_tokenizers_are_refused(token_url, tmp_path) -> None:
    other = str(tmp_path / "other")
    write_token_dataset(Store(other), B_DOCS, file_hash="xxh3_64:ffffffffffffffff")
    with pytest.raises(ValueError, match="different tokenizers"):
        make_loader([token_url, other], weights=[1, 1], seq_len=SEQ_LEN, batch_size=BATCH, num_workers=0)


# --- hypothesis: document lengths, topologies and stop points through the real loader ------------------
doc_lengths = st.lists(st.lists(st.integers(1, 40), min_size=0, max_size=5), min_size=1, max_size=5)
topologies = st.tuples(st.integers(1, 3), st.integers(0, 2))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(docs=doc_lengths, seq_len=st.integers(1, 12), packing=st.sampled_from(["concat", "aligned"]),
       first=topologies, second=topologies, stop=st.integers(0, 4), data=st.data())
def test_any_documents_topology_and_stop_point(tmp_path_factory, docs, seq_len, packing, first, second, stop,
                                               data) -> None:
    total = sum(map(sum, docs))
    assume(total > 1 and (packing == "concat" or max(n for d in docs for n in d) >= seq_len))
    root = str(tmp_path_factory.mktemp("hyp") / "ds")
    write_token_dataset(Store(root), docs, block_tokens=data.draw(st.integers(1, 32)))
    batch = data.draw(st.integers(1, 3))

    def make_at(topology):
        return [make_loader(root, seq_len=seq_len, batch_size=batch, num_workers=topology[1], rank=r,
                            world_size=topology[0], packing=packing, shuffle_window=3, seed=7)
                for r in range(topology[0])]

    deliver = loader_deliver(make_at, lambda b: tuple(trained_pairs(b)))
    steps = len(make_at(first)[0])
    got, _ = check_resume(deliver, loader_advance(make_at), lambda keys: keys, None,
                          [(first, min(stop, steps)), (second, None)])
    expected = total - (sum(len(d) for d in docs) if packing == "aligned" else 1)
    # every trained token once; what is missing is under one global batch of sequences of each level
    assert 0 <= expected - len(got) < (first[0] + second[0]) * batch * (seq_len + 1)


@pytest.mark.slow  # new interpreters (the spawn start method)
def test_worker_processes_work_with_the_spawn_start_method(token_url) -> None:
    kw = dict(seq_len=SEQ_LEN, batch_size=BATCH, num_workers=1, shuffle_window=5)  # one: spawned ones import torch
    auto = list(make_loader(token_url, **kw))
    spawned = list(make_loader(token_url, worker_mode="processes", multiprocessing_context="spawn", **kw))
    assert len(auto) == len(spawned) > 0
    assert all(torch.equal(x[k], y[k]) for x, y in zip(auto, spawned) for k in x)
