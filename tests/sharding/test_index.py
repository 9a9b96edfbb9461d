"""`shardify index`: Hugging Face-style Parquet files read as they are (made here with pyarrow), and
row groups bigger than the loader's window budget read in slices with the plan's guarantees."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataio import ManifestError, make_loader
from dataio.format.manifest import read_manifest
from dataio.plan.types import Segment
from dataio.readers.parquet import ParquetReader, ParquetSlice
from dataio.storage.store import Store
from tests.dataio.mixed_images import mixed_images
from tests.sharding.conftest import run
from tests.sharding.test_real_sources import hf_parquet

pytestmark = pytest.mark.timeout(180)
IMAGES = mixed_images()
NAMES = sorted(IMAGES)


@pytest.fixture
def hf_export(tmp_path: Path) -> Path:
    """data/train-0000{0,1}-of-00002.parquet, as `datasets` names its shards."""
    root = tmp_path / "export"
    (root / "data").mkdir(parents=True)
    hf_parquet(root / "data" / "train-00000-of-00002.parquet", NAMES[:9], row_group_size=4)
    hf_parquet(root / "data" / "train-00001-of-00002.parquet", NAMES[9:], row_group_size=100)
    return root


def test_loader_without_a_manifest_says_to_run_shardify_index(hf_export) -> None:
    with pytest.raises(ManifestError, match=r"shardify index"):
        make_loader(str(hf_export), batch_size=2)


def test_index_reads_the_export_in_place(hf_export, capsys) -> None:
    before = {p: p.read_bytes() for p in hf_export.rglob("*.parquet")}
    assert run("index", hf_export) == 0
    assert "image field(s) ['image']" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in hf_export.rglob("*.parquet")} == before  # nothing rewritten
    m = read_manifest(Store(str(hf_export)))
    assert m.num_samples == len(NAMES) and m.label_names == ("a", "b") and m.row_groups[0] == (4, 4, 1)
    assert {f.name: f.type for f in m.fields} == {"image": "image", "label": "int", "caption": "str"}
    assert run("index", hf_export) == 2 and "--overwrite" in capsys.readouterr().err
    assert run("verify", hf_export, "--quiet", "--workers", 1) == 0
    seen = {}
    with make_loader(str(hf_export), batch_size=4, image_size=8, train=False, tail="pad", num_workers=1) as loader:
        for batch in loader:
            assert batch["image"].shape[1:] == (3, 8, 8) and isinstance(batch["caption"], list)
            for caption, label, real in zip(batch["caption"], batch["label"], batch["mask"]):
                if real:
                    seen[caption] = int(label)
    assert seen == {f"a {n}": i % 2 for part in (NAMES[:9], NAMES[9:]) for i, n in enumerate(part)}


def test_struct_without_bytes_cannot_be_indexed(tmp_path, capsys) -> None:
    (tmp_path / "x").mkdir()
    hf_parquet(tmp_path / "x" / "a.parquet", NAMES[:2], bytes_field=False)
    assert run("index", tmp_path / "x") == 2
    assert "have no 'bytes' field" in capsys.readouterr().err
    assert not (tmp_path / "x" / "manifest.json").exists()


def big_group_dataset(root: Path, num_rows: int = 96, value_bytes: int = 4000) -> Path:
    """One Parquet file, one row group of `num_rows` rows, small pages (10 rows each)."""
    rng = np.random.default_rng(0)
    table = pa.table({"__key__": [f"{i:04d}" for i in range(num_rows)],
                      "blob": [rng.bytes(value_bytes) for _ in range(num_rows)],
                      "cls": list(range(num_rows))})
    root.mkdir(parents=True)
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=num_rows, write_batch_size=10, compression="none")
    (root / "part-0.parquet").write_bytes(buf.getvalue())
    assert run("index", root) == 0
    return root


def test_a_row_group_bigger_than_the_budget_is_read_in_slices(tmp_path) -> None:
    root = big_group_dataset(tmp_path / "big")
    store = Store(str(root))
    m = read_manifest(store)
    reader = ParquetReader(store, m, slice_bytes=100_000)  # the group holds ~384 KB
    pieces = [Segment(shard=0, start=a, stop=a + 24) for a in range(0, 96, 24)]
    payloads = [reader.fetch(seg) for seg in pieces]
    assert all(isinstance(p, ParquetSlice) and len(p) < 24 * 4000 + 4096 for p in payloads)
    keys = [s["__key__"] for seg, p in zip(pieces, payloads) for s in reader.parse(seg, p)]
    assert keys == [f"{i:04d}" for i in range(96)]
    whole = ParquetReader(store, m)
    assert [s["__key__"] for s in whole.parse(pieces[1], whole.fetch(pieces[1]))] == keys[24:48]


@pytest.mark.parametrize("world_size,num_workers", [(1, 2), (2, 1)])
def test_sliced_row_groups_keep_exactly_once(tmp_path, world_size, num_workers) -> None:
    root = big_group_dataset(tmp_path / "big")
    delivered = []
    for rank in range(world_size):
        with make_loader(str(root), batch_size=4, decode=None, rank=rank, world_size=world_size,
                         num_workers=num_workers, shuffle_window_bytes=60_000, seed=3) as loader:
            batches = list(loader)
            delivered += [k for b in batches for k in b["__key__"]]
    assert len(delivered) == len(set(delivered)) and 96 - len(delivered) < world_size * 4


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_write_reshards_a_multi_file_export(hf_export, tmp_path, fmt) -> None:
    dest = tmp_path / "ds"
    assert run("write", hf_export, dest, "--format", fmt, "--workers", 2, "--quiet") == 0
    m = read_manifest(Store(str(dest)))
    assert m.num_samples == len(NAMES) and m.label_names == ("a", "b")
    with make_loader(str(dest), batch_size=4, image_size=8, num_workers=0, shuffle=False, tail="pad") as loader:
        labels = [int(x) for b in loader for x, real in zip(b["label"], b["mask"]) if real]
    assert labels == [i % 2 for part in (NAMES[:9], NAMES[9:]) for i, _ in enumerate(part)]


def test_inspect_shows_a_hugging_face_label_histogram(hf_export, capsys) -> None:
    assert run("index", hf_export) == 0
    assert run("inspect", hf_export) == 0
    out = capsys.readouterr().out
    assert "label histogram" in out and "a" in out


def test_index_notes_files_without_page_crcs(hf_export, tmp_path, capsys) -> None:
    """pyarrow writes no page CRC-32 by default (nor does `datasets`): the loader will check big row
    groups whole before their rows, reading them twice, and `shardify index` says so up front."""
    assert run("index", hf_export) == 0
    assert "2 of the files (first: data/train-00000-of-00002.parquet) have no page checksums" in capsys.readouterr().out
    (tmp_path / "crc").mkdir()
    table = pq.read_table(hf_export / "data" / "train-00000-of-00002.parquet")
    pq.write_table(table, tmp_path / "crc" / "a.parquet", write_page_checksum=True)
    assert run("index", tmp_path / "crc") == 0
    assert "page checksums" not in capsys.readouterr().out


def test_index_holds_the_lease_and_is_refused_beside_a_writer(hf_export, capsys) -> None:
    """`shardify index` writes a manifest like a write does: not beside a writer holding the prefix's lease
    (exit 2, naming it), and the lease it held itself is gone when it is done."""
    import os
    import socket

    from dataio.format.versions import LEASE_NAME
    from sharding.write.lease import Lease

    with Lease(Store(str(hf_export)), "write --overwrite"):
        assert run("index", hf_export) == 2
        err = capsys.readouterr().err
        assert f"`shardify write --overwrite` on host {socket.gethostname()}, process {os.getpid()}" in err
    assert not (hf_export / "manifest.json").exists()
    assert run("index", hf_export) == 0
    assert (hf_export / "manifest.json").exists() and not (hf_export / LEASE_NAME).exists()
    assert not (hf_export / "versions").exists()  # the folder the lease made went with it
