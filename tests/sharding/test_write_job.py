"""The write engine's shapes: a ShardTask per shard, one WriteJob every shard shares, a journal given its
hooks when it is built, and the destination's folder asked of the Store, not around it."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from dataio.format.versions import Journal, JournalHead, batch_name
from dataio.storage.store import Store
from sharding.sources.base import SourceError
from sharding.sources.by_path import open_source
from sharding.write.config import ShardTask, WriteConfig, WriteJob, layout_of
from sharding.write.plan import plan_shards, shard_tasks
from sharding.write.shard import write_shard
from sharding.write.writer import check_folder
from tests.sharding.conftest import run


def test_the_plan_becomes_numbered_tasks_of_one_version(image_folder: Path) -> None:
    refs = open_source(str(image_folder)).refs
    plan = plan_shards(refs, WriteConfig(max_samples_per_shard=10))
    tasks = shard_tasks(plan, refs, generation=2, first=3, fmt="tar", num_prefixes=1)
    assert [t.index for t in tasks] == [3, 4, 5]  # an append's new shards follow the old three
    assert tasks[0].path == "shards/v000002/shard-000003.tar"
    assert [r.key for t in tasks for r in t.refs] == [refs[i].key for run_ in plan for i in run_]
    with pytest.raises(dataclasses.FrozenInstanceError):
        tasks[0].index = 9  # type: ignore[misc]


def test_a_job_crosses_to_a_worker_without_its_client_and_writes_a_task(image_folder: Path, tmp_path: Path) -> None:
    source, config = open_source(str(image_folder)), WriteConfig()
    dest = Store(str(tmp_path / "ds"))
    dest.write_bytes("probe", b"1")  # the parent's client is open
    job = pickle.loads(pickle.dumps(WriteJob(source=source, dest=dest, config=config,
                                             layout=layout_of(source, config))))
    assert job.dest._fs is None  # noqa: SLF001 - each worker opens its own
    task = ShardTask(index=7, path="shards/shard-000007.tar", refs=tuple(source.refs[:5]))
    reported: list[tuple[int, int]] = []
    result = write_shard(job, task, lambda n, b: reported.append((n, b)))
    assert (result.index, result.path, result.num_samples) == (7, task.path, 5)
    assert sum(n for n, _ in reported) == 5 and (tmp_path / "ds" / task.path).stat().st_size == result.num_bytes


def test_the_journal_takes_its_hooks_when_it_is_built(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    head = JournalHead(version="v000002", fingerprint="f")
    seen: list[bool] = []  # at each hook: was the batch already recorded?
    journal = Journal(store, head, flush_every_s=3600, num_batches=4,
                      before_flush=lambda: seen.append(store.exists(batch_name("v000002", 4))))
    journal.add({"index": 0, "path": "shards/v000002/shard-000000.tar"})
    journal.flush()
    assert seen == [False]  # called before the batch is written, once
    assert store.exists(batch_name("v000002", 4))  # a resumed journal's batches continue its numbering
    journal.flush()  # nothing pending: no batch, no hook
    assert seen == [False]


def test_a_destination_that_is_a_file_is_refused_naming_it(image_folder: Path, tmp_path: Path, capsys) -> None:
    target = tmp_path / "taken"
    target.write_bytes(b"not a dataset")
    assert Store(str(target)).root == str(target)
    with pytest.raises(SourceError, match="is a file, not a folder"):
        check_folder(Store(str(target)))
    assert run("write", image_folder, target, "--quiet") != 0
    assert f"{target} is a file, not a folder" in capsys.readouterr().err
    assert target.read_bytes() == b"not a dataset"
