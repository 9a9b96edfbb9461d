"""What a resumed run skips, as ids (dataio/loader/skips.py): step ranges, keys or ids, and the refusals."""

from __future__ import annotations

import json

import pytest

from dataio.errors import StateError
from dataio.format.manifest import read_manifest
from dataio.loader.make import make_loader
from dataio.loader.skips import ids_of_lines, ids_of_skipped_steps, parse_steps
from dataio.loader.which import sidecar_doc
from dataio.storage.store import Store
from tests.dataio.shardgen import write_parquet_dataset, write_tar_dataset


@pytest.fixture(scope="module")
def tar_and_parquet(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("skips")
    write_tar_dataset(Store(str(root / "t")), [5, 0, 7])
    write_parquet_dataset(Store(str(root / "p")), [4, 6], seed=1)
    return str(root / "t"), str(root / "p")


def test_step_ranges():
    assert parse_steps("7:9") == (7, 9) and parse_steps("12") == (12, 12)
    for bad in ("9:7", "0:3", "a:b", "3:"):
        with pytest.raises(ValueError, match="--skip-steps"):
            parse_steps(bad)


def test_lines_are_ids_or_keys(tar_and_parquet):
    stores = [Store(u) for u in tar_and_parquet]
    manifests = [read_manifest(s) for s in stores]
    got = ids_of_lines(["# bad batch", "000003", "000011", "", "5"], stores, manifests, where="bad.txt")
    assert got.tolist() == [3, 5, 11]  # tar keys (from the index) number the samples
    keys = _keys(tar_and_parquet[1])  # Parquet keys, read from the shards
    assert ids_of_lines([keys[7], keys[2]], stores[1:], manifests[1:], where="x").tolist() == [2, 7]
    with pytest.raises(ValueError, match=r"bad.txt line 2: no sample has key 'nope'"):
        ids_of_lines(["1", "nope"], stores, manifests, where="bad.txt")


def _keys(url: str) -> list[str]:
    """Keys in id order."""
    store = Store(url)
    from dataio.readers.by_format import make_reader
    from dataio.plan.types import Segment

    manifest = read_manifest(store)
    reader = make_reader(store, manifest, verify_checksums=True)
    out = []
    for shard, n in enumerate(manifest.shard_num_samples):
        seg = Segment(shard=shard, start=0, stop=n)
        out += [str(x["__key__"]) for x in reader.parse(seg, reader.fetch(seg))]
    return out


def test_steps_need_a_sidecar_that_covers_them_and_the_same_sources(tar_and_parquet, tmp_path):
    url = tar_and_parquet[0]
    with make_loader(url, batch_size=2, decode=None, seed=4, shuffle_window=4) as loader:
        it = iter(loader)
        steps = [next(it)["__key__"] for _ in range(3)]
        it.close()
        doc = sidecar_doc(step=3, epoch=0, grad_accum=1, sources=[(url, None)], loader_state=loader.state_dict())
    ckpts = Store(str(tmp_path))
    ckpts.write_bytes("ckpt-000000003.loader-state.json", doc)
    ids, where = ids_of_skipped_steps([ckpts], "2:3", [url])
    assert ids.tolist() == sorted(int(k) for k in steps[1] + steps[2]) and where.endswith("ckpt-000000003.loader-state.json")
    with pytest.raises(StateError, match=r"no checkpoint .* at step 4 or later \(newest: 3\)"):
        ids_of_skipped_steps([ckpts], "4:4", [url])
    with pytest.raises(StateError, match="sample ids are numbered by the sources in order"):
        ids_of_skipped_steps([ckpts], "1:1", [tar_and_parquet[1]])
    assert json.loads(doc)["step"] == 3
