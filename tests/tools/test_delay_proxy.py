"""The delay proxy in front of a real SeaweedFS: signed requests pass, delays and faults are real."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from dataio import StorageError
from dataio.storage.store import RetryPolicy, Store
from tools.delay_proxy import DelayProxy

PAYLOAD = bytes(range(256)) * 400  # 100 KiB


def _store(server, url, bucket, retry=RetryPolicy(max_attempts=1)):
    return Store(f"s3://{bucket}/p", replace(server.options(), endpoint_url=url), retry)


@pytest.fixture
def bucket(s3_server):
    name = s3_server.new_bucket()
    Store(f"s3://{name}/p", s3_server.options()).write_bytes("obj.bin", PAYLOAD)
    return name


def test_s3fs_works_through_the_proxy_and_signatures_verify(s3_server, bucket):
    with DelayProxy(s3_server.endpoint_url, delay_s=0.0) as proxy:
        store = _store(s3_server, proxy.url, bucket)
        store.write_bytes("new.bin", b"through the proxy" * 1000)  # PUT with a body
        assert store.read("new.bin") == b"through the proxy" * 1000
        assert store.read("obj.bin", 1000, 2000) == PAYLOAD[1000:2000]
        assert store.size("obj.bin") == len(PAYLOAD)  # HEAD keeps its Content-Length
        assert store.list() == ["new.bin", "obj.bin"]
        assert proxy.stats.num_requests >= 5
        wrong = Store(f"s3://{bucket}/p", replace(s3_server.options(), endpoint_url=proxy.url,
                                                  secret="wrong-secret"), RetryPolicy(max_attempts=1))
        with pytest.raises(StorageError):
            wrong.read("obj.bin")


def test_injected_delay_is_measured(s3_server, bucket):
    delay_s = 0.2
    with DelayProxy(s3_server.endpoint_url, delay_s=delay_s) as proxy:
        # No hedging: a hedge runs beside the read it doubles, so elapsed >= requests x delay holds
        # only for requests made one after the other (on a loaded machine the third read can pass
        # 3x the second's 0.2 s and be hedged).
        store = Store(f"s3://{bucket}/p", replace(s3_server.options(), endpoint_url=proxy.url, hedge=None),
                      RetryPolicy(max_attempts=1))
        before = proxy.stats.num_requests
        start = time.perf_counter()
        for _ in range(3):
            assert store.read("obj.bin", 0, 100) == PAYLOAD[:100]
        elapsed = time.perf_counter() - start
        num = proxy.stats.num_requests - before
    assert num >= 3
    assert elapsed >= num * delay_s


def test_every_get_failing_with_503_exhausts_retries(s3_server, bucket):
    with DelayProxy(s3_server.endpoint_url, delay_s=0.0, error_rate=1.0) as proxy:
        store = _store(s3_server, proxy.url, bucket, RetryPolicy(max_attempts=2, base_delay_s=0.0))
        with pytest.raises(StorageError, match="gave up after 2 attempts"):
            store.read("obj.bin", 0, 10)
        assert proxy.stats.num_errors >= 2


def test_truncated_bodies_are_detected_then_retried_to_success(s3_server, bucket):
    with DelayProxy(s3_server.endpoint_url, delay_s=0.0, truncate_rate=1.0) as proxy:
        store = _store(s3_server, proxy.url, bucket, RetryPolicy(max_attempts=2, base_delay_s=0.0))
        with pytest.raises(StorageError, match="gave up"):
            store.read("obj.bin", expect_size=len(PAYLOAD))
        assert proxy.stats.num_truncated >= 2
    with DelayProxy(s3_server.endpoint_url, delay_s=0.0, truncate_rate=0.3, reset_rate=0.2,
                    error_rate=0.2, seed=1) as proxy:
        store = _store(s3_server, proxy.url, bucket, RetryPolicy(max_attempts=30, base_delay_s=0.0))
        for _ in range(5):
            assert store.read("obj.bin", expect_size=len(PAYLOAD)) == PAYLOAD
        stats = proxy.stats
        assert stats.num_truncated + stats.num_resets + stats.num_errors > 0


def test_reset_connections_fail_cleanly(s3_server, bucket):
    with DelayProxy(s3_server.endpoint_url, delay_s=0.0, reset_rate=1.0) as proxy:
        store = _store(s3_server, proxy.url, bucket, RetryPolicy(max_attempts=2, base_delay_s=0.0))
        with pytest.raises(StorageError):
            store.read("obj.bin", 0, 10)
        assert proxy.stats.num_resets >= 2


def test_arguments_are_checked():
    with pytest.raises(ValueError):
        DelayProxy("https://example.com")
    with pytest.raises(ValueError):
        DelayProxy("http://127.0.0.1:1", error_rate=0.7, truncate_rate=0.7)
    with pytest.raises(ValueError):
        DelayProxy("http://127.0.0.1:1", delay_s=-1)


@pytest.mark.timeout(60)
def test_cli_prints_the_proxy_url(s3_server):
    proc = subprocess.Popen([sys.executable, "-m", "tools.delay_proxy", "--upstream", s3_server.endpoint_url,
                             "--delay-ms", "10"], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parents[2])
    try:
        line = proc.stdout.readline()
        assert line.startswith("proxy http://127.0.0.1:") and s3_server.endpoint_url in line
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


def test_stalls_hold_requests_then_serve_them_with_a_fixed_seed(s3_server, bucket):
    with DelayProxy(s3_server.endpoint_url, delay_s=0.0, stall_rate=1.0, stall_s=0.3) as proxy:
        store = Store(f"s3://{bucket}/p", replace(s3_server.options(), endpoint_url=proxy.url, hedge=None),
                      RetryPolicy(max_attempts=1))
        start = time.perf_counter()
        assert store.read("obj.bin", 0, 100) == PAYLOAD[:100]  # held, then served whole
        assert time.perf_counter() - start >= 0.3 and proxy.stats.num_stalls == 1
    proxies = [DelayProxy("http://127.0.0.1:1", stall_rate=0.3, seed=seed) for seed in (7, 7, 8)]
    picks = [[p._pick_stall("GET") for _ in range(50)] for p in proxies]
    assert picks[0] == picks[1] != picks[2] and 5 < sum(picks[0]) < 25
    assert not DelayProxy("http://127.0.0.1:1", stall_rate=1.0, methods=("PUT",))._pick_stall("GET")
