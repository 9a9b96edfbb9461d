"""Every write is confirmed by the store or fails loudly: PUTs failed (100%, 50%) or hung by the proxy.

Before: `Store.open_atomic` retried `f.close()` on an s3fs file that fsspec had already marked
closed when its upload raised, so the retry "succeeded" — `shardify write` printed success with
nothing stored, and the trainer recorded checkpoints that never existed.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dataio.errors import StorageError
from dataio.format.manifest import read_manifest
from dataio.storage.store import RetryPolicy, StorageOptions, Store
from tests.sharding.conftest import run
from tools.delay_proxy import DelayProxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

FAST = RetryPolicy(max_attempts=3, base_delay_s=0.0, max_delay_s=0.0)


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch) -> None:
    """Our retries without sleeping and botocore's inner ones off (the CLI and the trainer build
    their own policies; botocore backs off a second or two per throttled PUT): CI time."""
    monkeypatch.setattr(RetryPolicy, "delay_s", lambda self, attempt: 0.0)
    plain = StorageOptions.fsspec_kwargs

    def one_try(self, protocol):
        kwargs = plain(self, protocol)
        if "config_kwargs" in kwargs:
            kwargs["config_kwargs"]["retries"] = {"max_attempts": 1, "mode": "standard"}
        return kwargs

    monkeypatch.setattr(StorageOptions, "fsspec_kwargs", one_try)


def _flags(server, endpoint: str) -> list[str]:
    return ["--endpoint-url", endpoint, "--access-key", server.key, "--secret-key", server.secret,
            "--region", "us-east-1"]


def _direct(server, url: str) -> Store:
    return Store(url, server.options())


@pytest.mark.parametrize("size", [3000, 101 << 20])  # one PUT; a multipart upload (parts are PUTs)
def test_store_write_through_failing_puts_raises_naming_the_url(s3_server, size: int) -> None:
    url = f"s3://{s3_server.new_bucket()}/p"
    with DelayProxy(s3_server.endpoint_url, 0.0, error_rate=1.0, methods=("PUT",)) as proxy:
        store = Store(url, replace(s3_server.options(), endpoint_url=proxy.url), FAST)
        with (pytest.raises(StorageError, match=rf"uploading {url}/obj\.bin .*gave up after 3 attempts"),
              store.open_atomic("obj.bin") as f):
            f.write(b"x" * size)
        assert proxy.stats.num_errors >= 3
    assert _direct(s3_server, url).list() == []
    bucket = url.split("/")[2]
    assert not s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_store_write_through_a_hanging_put_fails_within_the_timeouts(s3_server) -> None:
    url = f"s3://{s3_server.new_bucket()}/p"
    with DelayProxy(s3_server.endpoint_url, 0.0, hang_rate=1.0, methods=("PUT",)) as proxy:
        options = replace(s3_server.options(), endpoint_url=proxy.url, connect_timeout_s=1.0, read_timeout_s=1.0)
        store = Store(url, options, RetryPolicy(max_attempts=2, base_delay_s=0.0, max_delay_s=0.0))
        with pytest.raises(StorageError, match=rf"uploading {url}/obj\.bin"):
            store.write_bytes("obj.bin", b"y" * 5000)
        assert proxy.stats.num_hangs >= 2
    assert _direct(s3_server, url).list() == []


def test_store_write_is_confirmed_by_size_and_etag(s3_server) -> None:
    url = f"s3://{s3_server.new_bucket()}/p"
    with DelayProxy(s3_server.endpoint_url, 0.0, error_rate=0.5, methods=("PUT",), seed=3) as proxy:
        store = Store(url, replace(s3_server.options(), endpoint_url=proxy.url),
                      RetryPolicy(max_attempts=8, base_delay_s=0.0, max_delay_s=0.0))
        for i in range(6):
            store.write_bytes(f"o{i}.bin", bytes([i]) * (1000 + i))
        assert proxy.stats.num_errors > 0
    direct = _direct(s3_server, url)
    assert [direct.read(f"o{i}.bin") for i in range(6)] == [bytes([i]) * (1000 + i) for i in range(6)]


def test_shardify_write_with_every_put_failing_exits_non_zero(s3_server, image_folder: Path, capsys) -> None:
    url = f"s3://{s3_server.new_bucket()}/ds"
    with DelayProxy(s3_server.endpoint_url, 0.0, error_rate=1.0, methods=("PUT",)) as proxy:
        code = run("write", image_folder, url, "--max-samples-per-shard", 10, "--workers", 1, "--quiet",
                   "--retry-budget", 2, *_flags(s3_server, proxy.url))  # retries end with the budget
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{url}/" in err and "gave up" in err  # the first PUT: the lease (creating), or a shard (uploading)
    assert s3_server.secret not in err
    assert not _direct(s3_server, url).exists("manifest.json")


@pytest.mark.parametrize("workers", [2])  # the shards in worker processes; 100% above runs them inline
def test_shardify_write_with_half_the_puts_failing_is_complete_or_fails(s3_server, image_folder: Path,
                                                                        capsys, workers: int) -> None:
    url = f"s3://{s3_server.new_bucket()}/ds"
    with DelayProxy(s3_server.endpoint_url, 0.0, error_rate=0.5, methods=("PUT",), seed=1) as proxy:
        code = run("write", image_folder, url, "--max-samples-per-shard", 5, "--workers", workers, "--quiet",
                   *_flags(s3_server, proxy.url))
        assert proxy.stats.num_errors > 0
    store = _direct(s3_server, url)
    if code != 0:  # a clean failure: no manifest
        assert not store.exists("manifest.json")
        return
    m = read_manifest(store)  # a success: every shard it names is there, whole
    assert m.num_samples == 24
    assert run("verify", url, "--quiet", *_flags(s3_server, s3_server.endpoint_url)) == 0


def test_trainer_reports_failed_checkpoints_keeps_training_and_records_none(s3_server, tmp_path,
                                                                           monkeypatch) -> None:
    from trainer.__main__ import main

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret)
    url = f"s3://{s3_server.new_bucket()}/run/ckpt"
    (tmp_path / "storage.toml").write_text("[s3]\nretry_budget_s = 1\n")  # each upload retries for 1 s
    with DelayProxy(s3_server.endpoint_url, 0.0, error_rate=1.0, methods=("PUT",)) as proxy:
        args = ["--data", "synthetic:?samples=64&classes=4", "--model", "mlp", "--image-size", "4",
                "--batch-size", "8", "--out", str(tmp_path), "--checkpoint-dir", url, "--checkpoint-every", "2",
                "--s3-endpoint-url", proxy.url, "--no-live", "--max-steps", "4",
                "--storage-config", str(tmp_path / "storage.toml")]
        assert main(args) == 3  # trained to the end, but nothing can be resumed
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    failed = [r for r in records if r["kind"] == "checkpoint_failed"]
    assert [r["step"] for r in failed] == [2, 4]  # each interval tried again
    assert all(f"{url}/ckpt-" in r["error"] and s3_server.secret not in r["error"] for r in failed)
    assert all("(budget 1 s)" in r["error"] for r in failed)  # the storage config's budget (before: 60 s)
    assert not [r for r in records if r["kind"] == "checkpoint"]
    assert any(r["kind"] == "note" and "FAILED and was not recorded" in r["text"] for r in records)
    assert records[-1]["kind"] == "summary"  # training went on to the end
    assert _direct(s3_server, url).list() == []


def test_write_dataset_through_hanging_puts_fails_and_publishes_nothing(s3_server, image_folder: Path) -> None:
    from sharding.progress import Progress
    from sharding.sources.by_path import open_source
    from sharding.write.writer import WriteConfig, write_dataset

    url = f"s3://{s3_server.new_bucket()}/ds"
    source = open_source(str(image_folder))
    with DelayProxy(s3_server.endpoint_url, 0.0, hang_rate=1.0, methods=("PUT",)) as proxy:
        options = replace(s3_server.options(), endpoint_url=proxy.url, connect_timeout_s=1.0, read_timeout_s=1.0)
        dest = Store(url, options, RetryPolicy(max_attempts=2, base_delay_s=0.0, max_delay_s=0.0))
        progress = Progress(total_samples=len(source.refs), total_bytes=1, what="write", quiet=True)
        try:
            with pytest.raises(StorageError, match=rf"(creating|uploading) {url}/"):
                write_dataset(source, dest, WriteConfig(max_samples_per_shard=10), progress)
        finally:
            progress.close()
        assert proxy.stats.num_hangs >= 2
    assert not _direct(s3_server, url).exists("manifest.json")


@pytest.fixture()
def small_parts(monkeypatch) -> None:
    """Multipart uploads from 6 MiB on, in 5 MiB parts (S3's smallest): three parts for 12 MiB."""
    from dataio.storage import store as store_module

    monkeypatch.setattr(store_module, "_SINGLE_PUT_BYTES", 6 << 20)
    monkeypatch.setattr(store_module, "_PART_BYTES", 5 << 20)


def _flip_once(times: list[int]):
    """A body filter that flips one byte of the first `times[0]` bodies it sees (memory going bad
    between our checksum and the wire: the store's own check passes, only ours can tell)."""

    def flip(data: bytes) -> bytes:
        if times[0] <= 0:
            return data
        times[0] -= 1
        return data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]

    return flip


@pytest.mark.parametrize("size", [5000, 12 << 20])  # one PUT; a multipart upload of three parts
def test_a_body_changed_after_its_checksum_is_caught_by_the_etag_and_sent_again(s3_server, small_parts,
                                                                               monkeypatch, size: int) -> None:
    url = f"s3://{s3_server.new_bucket()}/p"
    store = Store(url, s3_server.options(), FAST)
    flip = _flip_once([1])
    fs = store.fs
    pipe_file, call_s3 = fs.pipe_file, fs.call_s3
    monkeypatch.setattr(fs, "pipe_file", lambda path, data, **kw: pipe_file(path, flip(data), **kw))
    monkeypatch.setattr(fs, "call_s3", lambda method, **kw: call_s3(
        method, **({**kw, "Body": flip(kw["Body"])} if method == "upload_part" and kw["PartNumber"] == 2 else kw)))
    data = bytes(range(256)) * (size // 256) + b"tail"
    store.write_bytes("obj.bin", data)  # the first try's ETag gives it away; the second is whole
    assert _direct(s3_server, url).read("obj.bin") == data
    etag = s3_server.client().head_object(Bucket=url.split("/")[2], Key="p/obj.bin")["ETag"].strip('"')
    assert etag.endswith("-3") if size > 6 << 20 else "-" not in etag  # the form _confirm compared

    always = _flip_once([100])
    monkeypatch.setattr(fs, "pipe_file", lambda path, data, **kw: pipe_file(path, always(data), **kw))
    monkeypatch.setattr(fs, "call_s3", lambda method, **kw: call_s3(
        method, **({**kw, "Body": always(kw["Body"])} if method == "upload_part" else kw)))
    with pytest.raises(StorageError, match=r"uploading .*obj2\.bin .*ETag .* is not"):
        store.write_bytes("obj2.bin", data)
    assert not _direct(s3_server, url).exists("obj2.bin")  # removed (one PUT) or aborted (multipart)
    assert not s3_server.client().list_multipart_uploads(Bucket=url.split("/")[2]).get("Uploads")


def test_put_bodies_corrupted_on_the_wire_are_refused_and_sent_again(s3_server, small_parts) -> None:
    url = f"s3://{s3_server.new_bucket()}/p"
    data = {"small.bin": b"s" * 5000, "big.bin": bytes(range(256)) * (12 << 12)}
    with DelayProxy(s3_server.endpoint_url, 0.0, corrupt_rate=0.5, methods=("PUT",), seed=2) as proxy:
        store = Store(url, replace(s3_server.options(), endpoint_url=proxy.url),
                      RetryPolicy(max_attempts=10, base_delay_s=0.0, max_delay_s=0.0))
        for name, payload in data.items():
            store.write_bytes(name, payload)
        assert proxy.stats.num_corrupted > 0
    direct = _direct(s3_server, url)
    assert {name: direct.read(name) for name in data} == data
