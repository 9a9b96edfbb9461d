"""`shardify write --engine ray` on a local Ray: the local engine's shards byte for byte, crashes retried, failures named."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataio.storage.store import Store
from sharding.progress import Progress
from sharding.sources.by_path import open_source
from sharding.write.config import WriteConfig
from sharding.write.writer import write_dataset
from tests.sharding.conftest import run

if importlib.util.find_spec("ray") is None:  # not imported here: the engine sets Ray's environment first
    pytest.skip("Ray is not installed (pip install 'shardify[ray]')", allow_module_level=True)

# Ray keeps idle worker processes and driver threads for the session: they are its own, stopped at the end.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.allow_leaks]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray for the module, started the way the engine starts its own (loopback, no dashboard)."""
    from sharding.write.engine_ray import start_ray

    assert start_ray(None, 2)
    import psutil
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import the tests
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
    listening = {c.laddr.ip for p in psutil.Process().children(recursive=True)
                 for c in _connections(p) if c.status == psutil.CONN_LISTEN}
    assert listening and listening <= {"127.0.0.1", "::1", "::ffff:127.0.0.1"}, f"Ray listens on {listening}"
    yield
    ray.shutdown()


def _connections(proc):
    import psutil

    try:
        return proc.net_connections(kind="inet")
    except psutil.Error:
        return []


class CrashingSource:
    """A real source whose load of the shard holding `key` kills the Ray worker: once (a marker file), or always."""

    def __init__(self, inner, key: str, marker: Path | None) -> None:
        self.inner, self.key, self.marker = inner, key, marker

    def __getattr__(self, name: str):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def load(self, refs):
        if any(r.key == self.key for r in refs) and (self.marker is None or not self.marker.exists()):
            if self.marker is not None:
                self.marker.touch()
            os._exit(1)  # the worker dies mid-shard, its temporary file left behind
        return self.inner.load(refs)


COMMON = ("--max-samples-per-shard", 5, "--shuffle", "--seed", 3, "--prefixes", 2, "--quiet")


def _files(root: Path) -> dict[str, bytes]:
    """Every file but the write's journal (versions/: its times and the order shards finished differ)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not str(p.relative_to(root)).startswith("versions/")}


def _same_dataset(a: Path, b: Path) -> None:
    fa, fb = _files(a), _files(b)
    ma, mb = (json.loads(f.pop("manifest.json")) for f in (fa, fb))
    assert fa == fb  # every shard, index and sidecar byte for byte; no stray temporary file
    for m in (ma, mb):
        m.pop("created_utc"), m.pop("tool_version")
    assert ma == mb


def test_ray_engine_writes_the_local_engines_dataset(local_ray, image_folder: Path, tmp_path: Path) -> None:
    assert run("write", image_folder, tmp_path / "local", *COMMON, "--workers", 2) == 0
    assert run("write", image_folder, tmp_path / "ray", *COMMON, "--engine", "ray") == 0
    _same_dataset(tmp_path / "local", tmp_path / "ray")
    # A worker killed mid-shard: Ray retries the task; the shard is written once, the dataset the same.
    marker = tmp_path / "crashed"
    source = CrashingSource(open_source(str(image_folder)), "000007", marker)
    config = WriteConfig(max_samples_per_shard=5, shuffle=True, seed=3, num_prefixes=2, engine="ray", num_workers=2)
    progress = Progress(total_samples=24, total_bytes=1, what="write", quiet=True)
    write_dataset(source, Store(str(tmp_path / "retried")), config, progress)  # type: ignore[arg-type]
    progress.close()
    assert marker.exists()
    _same_dataset(tmp_path / "local", tmp_path / "retried")


def test_a_task_that_keeps_failing_is_named_and_no_manifest_is_written(local_ray, image_folder: Path,
                                                                        tmp_path: Path) -> None:
    from sharding.write.engine_ray import RayEngineError

    source = CrashingSource(open_source(str(image_folder)), "000007", None)
    config = WriteConfig(max_samples_per_shard=5, engine="ray", num_workers=2)
    progress = Progress(total_samples=24, total_bytes=1, what="write", quiet=True)
    with pytest.raises(RayEngineError, match=r"shard 1 \(shards/shard-000001.tar\).*no manifest was written"):
        write_dataset(source, Store(str(tmp_path / "ds")), config, progress)  # type: ignore[arg-type]
    progress.close()
    assert not (tmp_path / "ds" / "manifest.json").exists()
