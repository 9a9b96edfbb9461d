"""Hostile and sloppy inputs on the read side (issue 9): credentials in URLs, forged manifests,
stuck endpoints. Each test failed before its fix."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from dataio import ManifestError, ShardFormatError, StorageError, StorageOptions, make_loader
from dataio.storage.redact import redact, url_secrets
from dataio.storage.store import RetryPolicy, Store, with_retry
from sharding.cli import main as shardify
from tests.dataio.shardgen import write_tar_dataset

KEY, SECRET = "AKIAHOSTILEKEY", "s3cr3t-Hostile-Value"


@contextlib.contextmanager
def stuck_endpoint() -> Iterator[str]:
    """An http endpoint that accepts connections and never answers (nor closes them)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    srv.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(srv.accept()[0])

    thread = threading.Thread(target=accept, name="stuck-endpoint", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        srv.close()


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


# --- credentials anywhere in a URL ------------------------------------------------------------


def test_url_secrets_and_bare_userinfo_are_redacted():
    url = f"s3://{KEY}:{SECRET}@bucket/ds?X-Amz-Signature=abcd1234&x=1"
    assert set(url_secrets(url)) >= {KEY, SECRET, "abcd1234"}
    # botocore quotes a bucket name back without its scheme: 'Invalid bucket name "KEY:SECRET@bucket"'
    out = redact(f'Invalid bucket name "{KEY}:{SECRET}@bucket"')
    assert KEY not in out and SECRET not in out and "bucket" in out
    assert redact("error: see foo@example.com") == "error: see foo@example.com"  # not a credential


@pytest.mark.parametrize("url", [f"s3://{KEY}:{SECRET}@bucket/ds", f"s3://bucket/ds?X-Amz-Credential={KEY}&sig={SECRET}"])
def test_cli_errors_never_print_url_credentials(url, capsys):
    assert shardify(["inspect", url, "--endpoint-url", closed_port()]) == 2
    err = capsys.readouterr().err
    assert "error" in err and KEY not in err and SECRET not in err


@pytest.mark.parametrize("url", [f"s3://{KEY}:{SECRET}@bucket/ds", f"s3://bucket/ds?X-Amz-Credential={KEY}&sig={SECRET}"])
def test_loader_errors_never_show_url_credentials(url):
    with pytest.raises(StorageError) as info:
        make_loader(url, batch_size=2, num_workers=0, decode=None,
                    storage=StorageOptions(endpoint_url=closed_port()))
    assert KEY not in str(info.value) and SECRET not in str(info.value)


@pytest.mark.slow
def test_credentials_in_the_url_are_used_and_stay_hidden(s3_server):
    bucket = s3_server.new_bucket()
    write_tar_dataset(Store(f"s3://{bucket}/ds", s3_server.options()), [4, 3])
    endpoint = StorageOptions(endpoint_url=s3_server.endpoint_url, region="us-east-1")
    loader = make_loader(f"s3://{s3_server.key}:{s3_server.secret}@{bucket}/ds", batch_size=2, num_workers=0,
                         decode=None, storage=endpoint)
    assert sum(len(b["__key__"]) for b in loader) == 6
    with pytest.raises(StorageError) as info:
        make_loader(f"s3://{s3_server.key}:wrong-{SECRET}@{bucket}/ds", batch_size=2, num_workers=0,
                    decode=None, storage=endpoint)
    assert SECRET not in str(info.value) and s3_server.key not in str(info.value)


# --- forged sizes -------------------------------------------------------------------------------


def test_forged_sample_count_is_refused_by_the_loader(tmp_path):
    store = Store(str(tmp_path))
    write_tar_dataset(store, [5, 3])
    doc = json.loads(store.read("manifest.json"))
    doc["shards"]["num_samples"][0] = 10**12
    doc["num_samples"] = sum(doc["shards"]["num_samples"])
    store.write_bytes("manifest.json", json.dumps(doc).encode())
    with pytest.raises(ManifestError, match="claims 1000000000000 samples"):
        make_loader(str(tmp_path), batch_size=2, num_workers=0, decode=None)


def test_forged_shard_bytes_are_caught_when_the_shard_is_first_read(tmp_path):
    store = Store(str(tmp_path))
    write_tar_dataset(store, [5, 3])
    doc = json.loads(store.read("manifest.json"))
    doc["shards"]["num_bytes"][0] = 10**8
    doc["shards"]["num_samples"][0] = 10**4  # plausible for the forged bytes, and consistent
    doc["num_samples"] = sum(doc["shards"]["num_samples"])
    store.write_bytes("manifest.json", json.dumps(doc).encode())
    loader = make_loader(str(tmp_path), batch_size=2, num_workers=0, decode=None, check_shards=False,
                         shuffle=False)
    with pytest.raises(ShardFormatError, match="shard-000000.tar: shard is .* bytes but the manifest says 10+"):
        next(iter(loader))


@pytest.mark.timeout(60)
def test_forged_shard_bytes_on_s3_are_caught_by_the_first_ranged_read(moto_s3):
    # No HEAD on S3: the ranged GET's Content-Range states the object's size, checked there.
    store = Store(f"s3://{moto_s3.new_bucket()}/ds", moto_s3.options())
    write_tar_dataset(store, [5, 3])
    doc = json.loads(store.read("manifest.json"))
    doc["shards"]["num_bytes"][0] = 10**8  # the index and sample count still agree: only the size shows it
    store.write_bytes("manifest.json", json.dumps(doc).encode())
    for num_workers in (0, 2):
        loader = make_loader(store.raw_url, batch_size=2, num_workers=num_workers, decode=None, check_shards=False,
                             shuffle=False, storage=moto_s3.options())
        with pytest.raises(ShardFormatError, match="shard-000000.tar: shard is .* bytes but the manifest says 10+"):
            next(iter(loader))
        loader.close()


# --- timeouts and the retry budget ----------------------------------------------------------------


def test_retry_budget_bounds_all_tries_together():
    clock = [0.0]

    def slow_timeout() -> None:
        clock[0] += 12.0
        raise TimeoutError("read timed out")

    original = time.monotonic
    try:
        time.monotonic = lambda: clock[0]  # type: ignore[assignment]
        with pytest.raises(StorageError, match=r"gave up after 2 attempts in 24.0 s \(budget 30 s\)"):
            with_retry(slow_timeout, what="x", policy=RetryPolicy(max_attempts=9, base_delay_s=0.0, max_delay_s=0.0, deadline_s=30),
                       sleep=lambda s: None)
    finally:
        time.monotonic = original  # type: ignore[assignment]


@pytest.mark.slow  # waits out read timeouts: seconds
@pytest.mark.timeout(120)
def test_stuck_endpoint_fails_the_loader_and_shardify_within_30_s_by_default(capsys):
    """The loader (in a thread) and `shardify inspect` wait out the first request's budget side by side,
    each against the same endpoint that never answers: two waits of 30 s in the time of one."""
    failed: list[tuple[BaseException, float]] = []

    def load(endpoint: str) -> None:
        start = time.monotonic()
        try:
            make_loader("s3://bucket/ds", batch_size=2, num_workers=0, decode=None,
                        storage=StorageOptions(endpoint_url=endpoint, key="k", secret="s", read_timeout_s=2.0))
        except BaseException as exc:  # noqa: BLE001 - the assertions below say what was expected
            failed.append((exc, time.monotonic() - start))

    with stuck_endpoint() as endpoint:
        loader = threading.Thread(target=load, args=(endpoint,), name="stuck-loader")
        loader.start()
        start = time.monotonic()
        assert shardify(["inspect", "s3://bucket/ds", "--endpoint-url", endpoint, "--access-key", "k",
                         "--secret-key", "secret"]) == 2
        elapsed_s = time.monotonic() - start
        loader.join(timeout=60)
    assert "Timeout" in capsys.readouterr().err
    assert elapsed_s < 30 + 5  # the stated bound (30 s), with a margin for a loaded machine
    (error, loader_s), = failed
    assert isinstance(error, StorageError), repr(error)
    assert re.search(r"manifest.json: gave up after \d+ attempts in .* s \(budget 30 s\).*Timeout", str(error)), error
    assert loader_s < 30 + 5  # the budget, not minutes of retries
