"""Image-text pairs through make_loader(tokenizer=, context_length=): input_ids and attention_mask
checked against the tokenizer run directly, captions picked per epoch from the sample's seed, and
the picks unchanged by resuming at another world size (the resume harness)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from dataio import make_loader
from dataio.format.manifest import read_manifest
from dataio.format.token_layout import tokenizer_file_hash
from dataio.storage.store import Store
from dataio.stream.captions import load_caption_tokenizer
from sharding.cli import main as shardify
from sharding.write.tokenizer import train_bpe
from tests.dataio.loader_helpers import batch_summary
from tests.dataio.resume_harness import check_resume, check_save_load_state, loader_advance, loader_deliver
from tools.pair_data import pair, write_img2dataset_tars, write_pair_folder

pytestmark = pytest.mark.timeout(300)
NUM = 27  # every third sample has three captions (write_pair_folder)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(pair dataset URL, tokenizer.json) of NUM shapes with their captions."""
    root = tmp_path_factory.mktemp("pairs")
    src = write_pair_folder(root / "src", NUM)
    assert shardify(["write", str(src), str(root / "ds"), "--captions", "--quiet", "--max-samples-per-shard", "7"]) == 0
    train_bpe([c for i in range(60) for c in pair(i)[1]], 300, str(root / "tok.json"))
    return str(root / "ds"), str(root / "tok.json")


def _options(tok: str, **extra) -> dict:
    return dict(batch_size=3, image_size=16, tokenizer=tok, context_length=6, seed=5, **extra)


def _expected(tok: str, caption: str, length: int) -> tuple[list[int], list[int]]:
    t = load_caption_tokenizer(tok)
    ids = [*t.encode_batch([caption])[0][: length - 1], t.end_id]
    return ids + [0] * (length - len(ids)), [1] * len(ids) + [0] * (length - len(ids))


def _epoch(url: str, tok: str, epoch: int, **extra) -> dict[str, tuple[list[int], list[int]]]:
    loader = make_loader(url, num_workers=extra.pop("num_workers", 0), **_options(tok, **extra))
    loader.set_epoch(epoch)
    out = {}
    for batch in loader:
        assert batch["image"].shape == (3, 3, 16, 16)
        assert batch["input_ids"].dtype == torch.int64 and batch["input_ids"].shape == (3, 6)
        for i, key in enumerate(batch["__key__"]):
            out[key] = (batch["input_ids"][i].tolist(), batch["attention_mask"][i].tolist())
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
def test_input_ids_match_the_tokenizer_run_directly(pairs, num_workers) -> None:
    url, tok = pairs
    got = _epoch(url, tok, 0, num_workers=num_workers)
    assert len(got) == NUM
    for key, (ids, mask) in got.items():
        captions = pair(int(key))[1] if int(key) % 3 == 0 else pair(int(key))[1][:1]
        assert (ids, mask) in [_expected(tok, c, 6) for c in captions], key
        assert ids[sum(mask) - 1] == load_caption_tokenizer(tok).end_id  # cut captions keep their end token


def test_short_captions_are_padded_with_the_mask_zero(pairs) -> None:
    url, tok = pairs
    loader = make_loader(url, num_workers=0, **{**_options(tok), "context_length": 40})
    batch = next(iter(loader))
    for i, key in enumerate(batch["__key__"]):
        caption = next(c for c in pair(int(key))[1] if _expected(tok, c, 40)[0] == batch["input_ids"][i].tolist())
        assert _expected(tok, caption, 40)[1] == batch["attention_mask"][i].tolist()
        assert 0 < batch["attention_mask"][i].sum() < 40


def test_several_captions_are_drawn_per_epoch_deterministically(pairs) -> None:
    url, tok = pairs
    first, again, second = _epoch(url, tok, 0), _epoch(url, tok, 0), _epoch(url, tok, 1)
    assert first == again
    multi = [k for k in first if int(k) % 3 == 0]
    assert any(first[k] != second[k] for k in multi)  # a new epoch draws again
    assert all(first[k] == second[k] for k in first if int(k) % 3)  # one caption: always that one
    drawn = Counter(first[k][0][0] for k in multi) + Counter(second[k][0][0] for k in multi)
    assert len(drawn) > 1  # not always the first caption


def _ranks(url: str, tok: str, world_size: int, num_workers: int) -> list:
    return [make_loader(url, rank=r, world_size=world_size, num_workers=num_workers, **_options(tok))
            for r in range(world_size)]


def _pair_summary(batch: dict) -> tuple:
    return tuple(batch["__key__"]), tuple(batch["mask"].tolist()), tuple(map(tuple, batch["input_ids"].tolist()))


def _with_captions(summary: tuple) -> list[str]:
    """Real keys with the ids delivered for them: a resumed run must pick the same captions."""
    return [f"{k}:{ids}" for k, m, ids in zip(*summary) if m]


def test_captions_survive_resume_at_another_world_size(pairs) -> None:
    url, tok = pairs
    make_at = lambda topology: _ranks(url, tok, *topology)  # noqa: E731
    whole, _ = check_resume(loader_deliver(make_at, _pair_summary), loader_advance(make_at), _with_captions,
                            None, [((1, 0), None)])
    resumed, _ = check_resume(loader_deliver(make_at, _pair_summary), loader_advance(make_at), _with_captions,
                              None, [((2, 0), 2), ((3, 1), 1), ((1, 2), None)])
    assert len(whole) == NUM and len(resumed) > NUM - 3 * 3  # only a tail under one global batch is dropped
    assert set(resumed) <= set(whole)  # each sample with the caption the uninterrupted run drew


def test_stop_save_load_replays_captions_of_this_and_the_next_epoch(pairs) -> None:
    url, tok = pairs
    check_save_load_state(lambda: _ranks(url, tok, 2, 0), stop=2, summary=batch_summary)


def test_a_dataset_without_captions_is_refused_and_mixed_in_batches_of_its_kind(tmp_path, pairs) -> None:
    from tests.sharding.conftest import make_image_folder

    src = make_image_folder(tmp_path / "images", per_class=2)
    assert shardify(["write", str(src), str(tmp_path / "ds"), "--quiet"]) == 0
    images = str(tmp_path / "ds")
    with pytest.raises(ValueError, match=r"ds holds no captions \(fields \['jpg', 'png', 'cls'\]\), and "
                                         r"image-label, image-text and token datasets cannot share a batch"):
        make_loader(images, num_workers=0, **_options(pairs[1]))
    # in a mixture, each batch is of one kind (loader/kinds.py); asked to share batches, refused
    with make_loader([pairs[0], images], num_workers=0, **_options(pairs[1])) as loader:
        assert {b["kind"] for b in loader} == {"pairs", "samples"}
    with pytest.raises(ValueError, match=r"cannot mix .* \(pairs\) and .*ds \(samples\) in one batch"):
        make_loader([pairs[0], images], num_workers=0, mix_kinds="in_batch", **_options(pairs[1]))


def test_the_tokenizer_the_manifest_names_is_used_and_another_refused_naming_both(tmp_path, pairs) -> None:
    url, tok = pairs
    src = write_pair_folder(tmp_path / "src", 6)
    ds = tmp_path / "named"
    assert shardify(["write", str(src), str(ds), "--captions", "--tokenizer", tok, "--quiet"]) == 0
    info = read_manifest(Store(str(ds))).captions
    assert info.tokenizer.startswith("versions/v000001/tokenizer/") and info.tokenizer_hash == tokenizer_file_hash(tok)
    assert (ds / info.tokenizer).read_bytes() == Path(tok).read_bytes()
    options = {k: v for k, v in _options(tok).items() if k != "tokenizer"}
    got = {k: ids for b in make_loader(str(ds), num_workers=0, **options)
           for k, ids in zip(b["__key__"], b["input_ids"].tolist())}
    assert len(got) == 6 and all(ids in [_expected(tok, c, 6)[0] for c in pair(int(k))[1]] for k, ids in got.items())
    other = tmp_path / "other.json"
    train_bpe(["something else entirely"] * 5, 300, str(other))
    with pytest.raises(ValueError, match=r"written for the tokenizer .*tokenizer=.*other.json hashes to") as exc:
        make_loader(str(ds), num_workers=0, tokenizer=str(other), **options)
    assert str(ds) in str(exc.value) and info.tokenizer_hash in str(exc.value)
    with pytest.raises(ValueError, match="names no tokenizer: give tokenizer="):
        make_loader(url, num_workers=0, **options)
    assert shardify(["write", str(src), str(tmp_path / "bad"), "--captions", "--tokenizer", str(src / "00000.txt"),
                     "--quiet"]) == 2


def test_img2dataset_tars_written_as_they_are_load_unchanged(tmp_path, pairs) -> None:
    tars = write_img2dataset_tars(tmp_path / "tars", 3, failed=0)
    assert shardify(["write", str(tars), str(tmp_path / "ds"), "--quiet"]) == 0  # no --captions: txt as it is
    loader = make_loader(str(tmp_path / "ds"), num_workers=0, **{**_options(pairs[1]), "batch_size": 1})
    got = {b["__key__"][0]: b["input_ids"][0].tolist() for b in loader}
    assert got == {f"00000{i:04d}": _expected(pairs[1], pair(i)[1][0], 6)[0] for i in range(3)}


@pytest.mark.parametrize("decode,num_workers", [(None, 0), (None, 2), ("gpu", 0), ("gpu", 2), ("auto", 2)])
def test_captions_are_tokenized_whatever_decode_is(pairs, decode, num_workers) -> None:
    """decode=None: raw image bytes beside the ids; "gpu" / "auto": the RAW batches go to the GPU feed (here
    its CPU twin) with their captions tokenized in the workers; the ids are decode="cpu"'s, row for row."""
    from dataio.decode.gpu_codecs import CpuTwin
    from dataio.loader.gpu_feed import device_twin

    url, tok = pairs
    want = _epoch(url, tok, 1)
    with device_twin(lambda: CpuTwin()):
        loader = make_loader(url, num_workers=num_workers, decode=decode, **_options(tok))
        loader.set_epoch(1)
        got = {}
        for batch in loader:
            if decode is None:
                assert len(batch["jpg"]) == 3 and batch["jpg"][0][:2] == b"\xff\xd8"  # the JPEG's own bytes
            else:
                assert batch["image"].shape == (3, 3, 16, 16)
            for i, key in enumerate(batch["__key__"]):
                got[key] = (batch["input_ids"][i].tolist(), batch["attention_mask"][i].tolist())
        loader.close()
    assert got == want


def test_bad_options_are_refused(pairs) -> None:
    url, tok = pairs
    with pytest.raises(ValueError, match="give tokenizer="):
        make_loader(url, batch_size=2, context_length=8, num_workers=0)
    with pytest.raises(ValueError, match="context_length must be an int >= 2"):
        make_loader(url, batch_size=2, tokenizer=tok, context_length=1, num_workers=0)
    with pytest.raises(ValueError, match="cannot read it"):
        make_loader(url, batch_size=2, tokenizer=str(Path(tok).with_name("none.json")), context_length=8,
                    num_workers=0)


def test_a_sample_without_its_caption_is_named() -> None:
    from dataio.errors import CorruptSampleError
    from dataio.stream.captions import CaptionStage

    stage = CaptionStage(tokenizer="unused.json", context_length=8, seed=0)
    assert stage.captions({"txt": b"a cat", "json": {"captions": ["a cat", "a kitten"]}}) == ["a cat", "a kitten"]
    with pytest.raises(CorruptSampleError, match=r"s3://b/shard-000001.tar: sample '000042' has no caption "
                                                 r"\(field 'txt'; it has \['jpg'\]\)"):
        stage.captions({"__key__": "000042", "__url__": "s3://b/shard-000001.tar", "jpg": b"..."})


def test_a_mixture_of_pair_datasets_tokenizes_every_source(tmp_path, pairs) -> None:
    tars = write_img2dataset_tars(tmp_path / "tars", 12, failed=0)
    assert shardify(["write", str(tars), str(tmp_path / "i2d"), "--captions", "--quiet"]) == 0
    loader = make_loader([pairs[0], str(tmp_path / "i2d")], weights=[2, 1], num_workers=0, **_options(pairs[1]))
    seen = {0: 0, 1: 0}
    for batch in loader:
        assert batch["input_ids"].shape == (3, 6) and (batch["attention_mask"].sum(1) > 0).all()
        for s in batch["source"].tolist():
            seen[s] += 1
    assert seen[0] > seen[1] > 0
