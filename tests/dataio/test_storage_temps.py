"""Temporary files of atomic local publishes: removed when their block ends, and by remove_open() in a
process that stops at once (os._exit) where no block could end them."""

from __future__ import annotations

import os

from dataio.storage.store import Store
from dataio.storage.temps import remove_open


def _temps(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)


def test_a_publish_leaves_no_temporary_file_and_none_registered(tmp_path):
    store = Store(str(tmp_path))
    with store.open_atomic("a.bin") as f:
        f.write(b"x")
        assert len(_temps(tmp_path)) == 1
    assert (tmp_path / "a.bin").read_bytes() == b"x" and _temps(tmp_path) == []
    assert remove_open() == []


def test_a_block_that_never_ended_is_cleaned_by_remove_open(tmp_path):
    # The stop came after the generator yielded the file and before a `with` owned it: no __exit__.
    store = Store(str(tmp_path))
    cm = store.open_atomic("shard.tar")
    f = cm.__enter__()
    f.write(b"half")
    [name] = _temps(tmp_path)
    assert name.startswith(".shard.tar.tmp-") and f".tmp-{os.getpid()}-" in name
    removed = remove_open()
    assert [os.path.basename(p) for p in removed] == [name]
    assert _temps(tmp_path) == [] and not (tmp_path / "shard.tar").exists()  # nothing published
    f.close()


def test_a_forked_child_does_not_remove_its_parents_files(tmp_path):
    store = Store(str(tmp_path))
    with store.open_atomic("p.bin") as f:
        f.write(b"parent")
        pid = os.fork()
        if pid == 0:  # the child: its own list is empty
            os._exit(0 if remove_open() == [] else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert len(_temps(tmp_path)) == 1  # still there: the parent's block owns it
    assert (tmp_path / "p.bin").read_bytes() == b"parent"
