"""GCS resumable uploads of shardify's own (dataio/storage/gcs_resumable.py): shard uploads above the threshold
go through them and are confirmed; a write killed mid-upload leaves its session recorded beside its journal,
and `shardify gc` cancels it (DELETE, answered 499), reports it, and never prints the session's upload_id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from dataio.format.manifest import read_manifest
from dataio.format.versions import VERSIONS_DIR
from dataio.storage import gcs_resumable
from dataio.storage.store import Store
from tests.sharding.conftest import run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

_REPO = Path(__file__).resolve().parents[2]


def _config(gcs_server, tmp_path: Path) -> str:
    """A storage config file reaching fake-gcs-server, every object >= 1 byte a resumable upload."""
    path = tmp_path / "storage.toml"
    options = gcs_server.options()
    path.write_text(f'[gcs]\nendpoint_url = "{options.gcs_endpoint_url}"\ntoken = "anon"\n'
                    'project = "shardify-test"\nresumable_bytes = 1\n')
    return str(path)


def _sessions(store: Store) -> list[str]:
    return [rel for rel in store.list() if rel.startswith(f"{VERSIONS_DIR}/") and "/sessions/" in rel]


def test_a_write_through_resumable_uploads_publishes_and_confirms(gcs_server, image_folder: Path, tmp_path: Path,
                                                                     monkeypatch) -> None:
    opened: list[str] = []
    start = gcs_resumable.start
    monkeypatch.setattr(gcs_resumable, "start", lambda fs, path, generation=None: opened.append(path)
                        or start(fs, path, generation))
    url, conf = f"gs://{gcs_server.new_bucket()}/ds", _config(gcs_server, tmp_path)
    assert run("write", image_folder, url, "--max-samples-per-shard", 10, "--workers", 1, "--quiet",
               "--storage-config", conf) == 0
    store = Store(url, replace(gcs_server.options(), gcs_resumable_bytes=1))
    manifest = read_manifest(store)
    assert manifest.num_samples == 24
    assert {p.split("/ds/", 1)[1] for p in opened} >= set(manifest.shard_paths)  # each shard went resumable
    assert _sessions(store) == []  # each finished upload dropped its record
    assert run("verify", url, "--quiet", "--storage-config", conf) == 0


def test_chunks_of_a_resumable_upload_arrive_whole(gcs_server, monkeypatch) -> None:
    monkeypatch.setattr(gcs_resumable, "CHUNK_BYTES", 256 << 10)
    store = Store(f"gs://{gcs_server.new_bucket()}/p", replace(gcs_server.options(), gcs_resumable_bytes=1))
    data = os.urandom((600 << 10) + 7)  # three chunks, the last short
    store.write_bytes("big.bin", data)
    assert store.read("big.bin") == data


_KILLED_WRITER = """
import os, signal, sys
from dataio.storage import gcs_resumable
send = gcs_resumable.send
def killed(fs, uri, *args, **kwargs):  # a shard's session is open and recorded: die before its first byte
    if "shards%2Fshard-" in uri:
        os.kill(os.getpid(), signal.SIGKILL)
    return send(fs, uri, *args, **kwargs)
gcs_resumable.send = killed
from sharding.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _shardify(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(_REPO)}
    return subprocess.run([sys.executable, "-m", "sharding.cli", *args], capture_output=True, text=True,
                          timeout=90, env=env, cwd=_REPO)


def test_gc_cancels_the_session_of_a_write_killed_mid_upload(gcs_server, image_folder: Path,
                                                              tmp_path: Path) -> None:
    url, conf = f"gs://{gcs_server.new_bucket()}/ds", _config(gcs_server, tmp_path)
    killed = subprocess.run([sys.executable, "-c", _KILLED_WRITER, "write", str(image_folder), url, "--workers", "1",
                             "--max-samples-per-shard", "10", "--quiet", "--storage-config", conf],
                            capture_output=True, text=True, timeout=90, cwd=_REPO,
                            env={**os.environ, "PYTHONPATH": str(_REPO)})
    assert killed.returncode == -9, killed.stderr[-2000:]
    store = Store(url, gcs_server.options())
    records = _sessions(store)
    assert len(records) == 1
    uri = json.loads(store.read(records[0]))["uri"]
    upload_id = uri.split("upload_id=", 1)[1].split("&", 1)[0]
    assert len(upload_id) >= 16
    out = _shardify("gc", url, "--grace", "0s", "--storage-config", conf)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "cancelled 1 stale resumable upload session" in out.stdout, out.stdout
    assert "cancelled upload session of shards/shard-" in out.stdout
    assert _sessions(store) == []
    again = _shardify("gc", url, "--grace", "0s", "--storage-config", conf)  # nothing left to cancel
    assert again.returncode == 0 and "upload session" not in again.stdout, again.stdout
    for text in (killed.stdout, killed.stderr, out.stdout, out.stderr, again.stdout, again.stderr):
        assert upload_id not in text
