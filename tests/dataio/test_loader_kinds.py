"""Mixtures across kinds (plan/kinds.py, loader/kinds.py): an image-label dataset, an image-text pair
dataset and a token dataset in one loader, each batch of one kind and tagged with it; exactly once per
source, weights by samples, resume at another world size (the resume harness), state and schedules."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from dataio import make_loader
from dataio.errors import StateError
from dataio.loader.protocol import TrainLoader
from dataio.format.token_layout import tokenizer_file_hash
from dataio.plan.kinds import KindOrder, kind_counts, kind_pieces
from dataio.plan.schedule import Piece, Schedule
from dataio.storage.store import Store
from sharding.cli import main as shardify
from sharding.write.tokenizer import train_bpe
from tests.dataio.resume_harness import check_resume, check_save_load_state, loader_advance, loader_deliver
from tests.dataio.shardgen import write_tar_dataset
from tests.dataio.tokengen import write_token_dataset
from tools.pair_data import pair, write_pair_folder

pytestmark = pytest.mark.timeout(300)
NUM_IMAGES, NUM_PAIRS, SEQ_LEN = 14, 12, 7
DOCS = [[20, 9], [15], [30, 4]]  # 78 tokens: 9 sequences of 8 (seq_len + 1) tokens


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """URLs of the three kinds and the captions' tokenizer."""
    root = tmp_path_factory.mktemp("kinds")
    write_tar_dataset(Store(str(root / "images")), [5, 5, 4], real_images=True)
    src = write_pair_folder(root / "pair-src", NUM_PAIRS, size=16)
    assert shardify(["write", str(src), str(root / "pairs"), "--captions", "--quiet", "--max-samples-per-shard", "5"]) == 0
    train_bpe([c for i in range(40) for c in pair(i)[1]], 300, str(root / "tok.json"))
    # one tokenizer for captions and tokens: the token dataset names it (by its hash), as a real one would
    write_token_dataset(Store(str(root / "tokens")), DOCS, block_tokens=16, file_hash=tokenizer_file_hash(str(root / "tok.json")))
    return {"images": str(root / "images"), "pairs": str(root / "pairs"), "tokens": str(root / "tokens"),
            "tok": str(root / "tok.json")}


def _make(kinds: dict[str, str], *, weights=None, rank=0, world_size=1, **extra):
    urls = [kinds["images"], kinds["pairs"], kinds["tokens"]]
    options = dict(batch_size=2, image_size=16, tokenizer=kinds["tok"], context_length=6, seq_len=SEQ_LEN,
                   seed=3, shuffle_window=4)
    return make_loader(urls, weights=weights, rank=rank, world_size=world_size, num_workers=0, **{**options, **extra})


def _keys(batch: dict) -> tuple[str, ...]:
    """The batch's rows as kind:source:identity (a sequence by its first token, unique in concat packing)."""
    sources = batch["source"].tolist()
    if batch["kind"] == "tokens":
        return tuple(f"tokens:{s}:{int(row[0])}" for s, row in zip(sources, batch["input_ids"]))
    return tuple(f"{batch['kind']}:{s}:{k}" for s, k in zip(sources, batch["__key__"]))


def _summary(batch: dict) -> tuple:
    mask = batch["mask"].tolist() if "mask" in batch else [True] * len(batch["source"])
    return batch["kind"], tuple(batch["source"].tolist()), tuple(k for k, m in zip(_keys(batch), mask) if m)


def test_each_batch_is_one_kind_with_its_own_fields(kinds) -> None:
    with _make(kinds) as loader:
        assert isinstance(loader, TrainLoader)  # what a trainer reads of any loader
        steps = len(loader)
        batches = list(loader)
    assert len(batches) == steps
    by_kind = Counter(b["kind"] for b in batches)
    assert set(by_kind) == {"samples", "pairs", "tokens"}
    for b in batches:
        fields = {"samples": {"image", "label"}, "pairs": {"image", "input_ids", "attention_mask"},
                  "tokens": {"input_ids", "labels"} if "labels" in b else {"input_ids"}}[b["kind"]]
        assert fields <= set(b), (b["kind"], sorted(b))
        assert b["source"].tolist() == [{"samples": 0, "pairs": 1, "tokens": 2}[b["kind"]]] * 2
        if b["kind"] == "samples":
            assert "input_ids" not in b and b["image"].shape == (2, 3, 16, 16)
        if b["kind"] == "pairs":
            assert b["input_ids"].shape == (2, 6) and b["label"].tolist() == [-1, -1]  # pairs have no labels


def test_weights_split_the_epoch_by_samples_exactly_once_per_source(kinds) -> None:
    """Weights 2:1:1 of an epoch of 40 samples: 20 image samples (a source of 14 upsampled: no repeat
    within a pass), 10 pairs, 10 sequences (9 in a pass); each kind's batches are its count / batch."""
    with _make(kinds, weights=[2, 1, 1], epoch_samples=40) as loader:
        assert loader.counts == {"samples": 20, "pairs": 10, "tokens": 10}
        batches = list(loader)
    per_kind = Counter(b["kind"] for b in batches)
    assert per_kind == {"samples": 10, "pairs": 5, "tokens": 5}
    for kind, distinct in (("samples", NUM_IMAGES), ("pairs", 10), ("tokens", 9)):
        keys = [k for b in batches if b["kind"] == kind for k in _keys(b)]
        assert len(set(keys[:distinct])) == distinct  # a pass never repeats a sample
    # the kinds are spread over the epoch, within a batch of their shares
    order = [b["kind"] for b in batches]
    for n in range(1, len(order) + 1):
        assert abs(order[:n].count("samples") - n / 2) < 1.01


def test_default_epoch_is_every_source_once_per_kind(kinds) -> None:
    with _make(kinds, weights=[NUM_IMAGES, NUM_PAIRS, 9]) as loader:
        batches = list(loader)
    for kind, num in (("samples", NUM_IMAGES), ("pairs", NUM_PAIRS), ("tokens", 9)):
        keys = [k for b in batches if b["kind"] == kind for k in _keys(b)]
        assert len(keys) == len(set(keys)) == num - num % 2  # exactly once, a tail under one batch dropped


def test_resume_at_another_world_size_delivers_the_rest_exactly_once(kinds) -> None:
    def make_at(topology):
        world_size, _ = topology
        return [_make(kinds, weights=[NUM_IMAGES, NUM_PAIRS, 9], rank=r, world_size=world_size)
                for r in range(world_size)]

    deliver, advance = loader_deliver(make_at, _summary), loader_advance(make_at)
    delivered, _ = check_resume(deliver, advance, lambda s: s[2], None, [((2, 1), 2), ((1, 1), 3), ((3, 1), None)])
    for kind in ("samples", "pairs", "tokens"):
        assert any(k.startswith(kind) for k in delivered)


def test_save_and_load_state_replays_the_rest_and_the_next_epoch(kinds) -> None:
    check_save_load_state(lambda: [_make(kinds, rank=r, world_size=2) for r in range(2)], stop=3, summary=_summary)


def test_a_state_of_other_sources_is_refused(kinds) -> None:
    with _make(kinds) as loader:
        state = loader.state_dict()
    with _make(kinds, weights=[1, 2, 1]) as other, pytest.raises(StateError, match="same sources, weights"):
        other.load_state_dict(state)
    with make_loader(kinds["images"], batch_size=2, num_workers=0, image_size=16) as single:
        with pytest.raises(StateError):
            single.load_state_dict(state)
    with _make(kinds) as loader, pytest.raises(StateError, match="no 'kinds' key"):
        loader.load_state_dict(single.state_dict())


def test_mixed_batches_are_refused_in_one_sentence_naming_both(kinds) -> None:
    with pytest.raises(ValueError) as info:
        _make(kinds, mix_kinds="in_batch")
    message = str(info.value)
    assert kinds["images"] in message and kinds["pairs"] in message and message.count(". ") == 0


def test_a_token_source_without_seq_len_is_refused_naming_it(kinds) -> None:
    with pytest.raises(ValueError, match="pass seq_len") as info:
        _make(kinds, seq_len=None)
    assert kinds["tokens"] in str(info.value)


def test_a_schedule_moves_weight_within_a_kind(kinds) -> None:
    """Two image sources and a pair source: the schedule moves the images' weight from one to the other,
    the kinds' shares stay; a schedule that changes a kind's share is refused."""
    urls = [kinds["images"], kinds["images"], kinds["pairs"]]
    options = dict(batch_size=2, image_size=16, tokenizer=kinds["tok"], context_length=6, num_workers=0, seed=1)
    schedule = Schedule((Piece((2.0, 0.0, 2.0), samples=12), Piece((0.0, 2.0, 2.0))))
    with make_loader(urls, weights=schedule, epoch_samples=24, **options) as loader:
        batches = list(loader)
    samples = [b for b in batches if b["kind"] == "samples"]
    assert Counter(b["kind"] for b in batches) == {"samples": 6, "pairs": 6}
    first, last = samples[0]["source"].tolist(), samples[-1]["source"].tolist()
    assert set(first) == {0} and set(last) == {1}
    with pytest.raises(ValueError, match="keeps each kind's share"):
        make_loader(urls, weights=Schedule((Piece((1.0, 1.0, 2.0), samples=12), Piece((1.0, 1.0, 1.0)))),
                    epoch_samples=24, **options)


def test_kind_counts_and_order_are_arithmetic() -> None:
    assert kind_counts([10, 6, 4], [1, 1, 2], ["samples", "pairs", "samples"], 20) == {"samples": 15, "pairs": 5}
    order = KindOrder(counts=(4, 2))
    kinds = order.kinds().tolist()
    assert Counter(kinds) == {0: 4, 1: 2}
    later = KindOrder(counts=(4, 2), delivered=3)
    assert later.kinds().tolist() == kinds[3:]
    assert KindOrder.fitted(later, later.left()) is later  # same topology: the same order goes on
    assert KindOrder.fitted(later, (1, 1)) == KindOrder(counts=(1, 1))
    assert kind_pieces([Piece((1.0, 3.0))], ["samples", "pairs"], ["a", "b"]) == {"samples": None, "pairs": None}
    assert np.array_equal(KindOrder.from_dict(later.to_dict()).kinds(), later.kinds())
    with pytest.raises(StateError):
        KindOrder.from_dict({"counts": [1], "delivered": 5})


def test_kinds_read_by_worker_processes_give_the_batches_of_in_process_reading(kinds) -> None:
    """Each kind's own readers (here a worker process each for images and pairs) interleave as in process."""
    with _make(kinds, weights=[NUM_IMAGES, NUM_PAIRS, 9]) as here:
        want = [_summary(b) for b in here]
    options = dict(batch_size=2, image_size=16, tokenizer=kinds["tok"], context_length=6, seq_len=SEQ_LEN, seed=3,
                   shuffle_window=4)
    with make_loader([kinds["images"], kinds["pairs"], kinds["tokens"]], weights=[NUM_IMAGES, NUM_PAIRS, 9],
                     num_workers=1, **options) as loader:
        assert "processes x1" in loader.describe()
        got = [_summary(b) for b in loader]
    assert got == want


def test_a_scheduled_mixture_across_kinds_resumes_at_another_world_size(kinds) -> None:
    urls = [kinds["images"], kinds["images"], kinds["pairs"]]
    schedule = Schedule((Piece((2.0, 0.0, 2.0), samples=12), Piece((0.0, 2.0, 2.0))))

    def make_at(topology):
        world_size, _ = topology
        return [make_loader(urls, weights=schedule, epoch_samples=24, batch_size=2, image_size=16,
                            tokenizer=kinds["tok"], context_length=6, num_workers=0, seed=1, rank=r,
                            world_size=world_size) for r in range(world_size)]

    deliver, advance = loader_deliver(make_at, _summary), loader_advance(make_at)
    delivered, _ = check_resume(deliver, advance, lambda s: s[2], None, [((2, 1), 2), ((1, 1), 1), ((3, 1), None)])
    assert {k.split(":")[0] for k in delivered} == {"samples", "pairs"}
