"""shardify against a real S3 server (SeaweedFS on 127.0.0.1): write, inspect, verify, bad credentials."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataio.format.manifest import read_manifest
from dataio.storage.store import Store
from tests.sharding.conftest import run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _flags(server, *, secret: str | None = None) -> list[str]:
    return ["--endpoint-url", server.endpoint_url, "--access-key", server.key,
            "--secret-key", secret or server.secret, "--region", "us-east-1"]


@pytest.mark.parametrize("fmt,workers", [("tar", 2), ("parquet", 1)])
def test_write_and_verify_on_s3(s3_server, image_folder: Path, tmp_path: Path, capsys, fmt: str, workers: int) -> None:
    url = f"s3://{s3_server.new_bucket()}/datasets/small"
    flags = _flags(s3_server)
    assert run("write", image_folder, url, "--format", fmt, "--max-samples-per-shard", 10, "--shuffle",
               "--workers", workers, "--quiet", *flags) == 0
    assert run("verify", url, "--quiet", *flags) == 0
    assert run("inspect", url, *flags) == 0
    out = capsys.readouterr().out
    assert "24" in out and "bee" in out and s3_server.secret not in out
    m = read_manifest(Store(url, s3_server.options()))
    assert m.num_samples == 24 and m.num_shards == 3
    # The same dataset written locally has the same shards, byte for byte.
    assert run("write", image_folder, tmp_path / "local", "--format", fmt, "--max-samples-per-shard", 10,
               "--shuffle", "--quiet") == 0
    assert read_manifest(Store(str(tmp_path / "local"))).shard_checksums == m.shard_checksums
    # A non-empty prefix is refused without --overwrite, then replaced with it.
    assert run("write", image_folder, url, "--quiet", *flags) == 2
    assert run("write", image_folder, url, "--overwrite", "--quiet", "--format", fmt, *flags) == 0


def test_wrong_credentials(s3_server, image_folder: Path, capsys) -> None:
    url = f"s3://{s3_server.new_bucket()}/ds"
    assert run("write", image_folder, url, "--quiet", *_flags(s3_server, secret="wrong-secret-123")) == 2
    err = capsys.readouterr().err
    assert url in err and "--access-key" in err and "wrong-secret-123" not in err and "Traceback" not in err
    assert not Store(url, s3_server.options()).exists("manifest.json")


def test_missing_bucket(s3_server, image_folder: Path, capsys) -> None:
    assert run("write", image_folder, "s3://no-such-bucket-x1/ds", "--quiet", *_flags(s3_server)) == 2
    assert "no-such-bucket-x1" in capsys.readouterr().err


def test_credentials_from_config_file_and_environment(s3_server, image_folder: Path, tmp_path: Path,
                                                      monkeypatch, capsys) -> None:
    url = f"s3://{s3_server.new_bucket()}/ds"
    config = tmp_path / "s3.toml"
    config.write_text(f'[s3]\nendpoint_url = "{s3_server.endpoint_url}"\nkey = "{s3_server.key}"\n'
                      f'secret = "{s3_server.secret}"\nregion = "us-east-1"\n')
    assert run("write", image_folder, url, "--storage-config", config, "--workers", 1, "--quiet") == 0
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    assert run("verify", url, "--quiet") == 0
    assert s3_server.secret not in capsys.readouterr().out
