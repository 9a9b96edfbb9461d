"""The local S3 servers: real writes and reads, enforced credentials, clean shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from botocore.exceptions import ClientError

from dataio import StorageError
from dataio.storage.store import RetryPolicy, Store
from tools.s3_server import S3Server, pick_weed_ports

ONE_TRY = RetryPolicy(max_attempts=1)


def test_write_read_list_through_store(s3_server):
    store = Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options(), ONE_TRY)
    store.write_bytes("a/b.bin", b"x" * 1000)
    store.write_bytes("c.txt", b"hello")
    assert store.read("a/b.bin", 10, 20) == b"x" * 10
    assert store.read("c.txt") == b"hello"
    assert store.size("a/b.bin") == 1000
    assert store.list() == ["a/b.bin", "c.txt"]


def test_wrong_credentials_are_refused(s3_server):
    bucket = s3_server.new_bucket()
    Store(f"s3://{bucket}", s3_server.options()).write_bytes("k", b"v")
    wrong = replace(s3_server.options(), secret="not-the-secret")
    with pytest.raises(StorageError) as err:
        Store(f"s3://{bucket}", wrong, ONE_TRY).read("k")
    assert "not-the-secret" not in str(err.value)
    assert s3_server.secret not in str(err.value)
    with pytest.raises(ClientError):
        import boto3

        boto3.client("s3", endpoint_url=s3_server.endpoint_url, aws_access_key_id="nobody",
                     aws_secret_access_key="nothing", region_name="us-east-1").list_buckets()


def test_buckets_are_fresh_and_distinct(s3_server):
    a, b = s3_server.new_bucket(), s3_server.new_bucket()
    assert a != b and a.startswith("t-")
    assert Store(f"s3://{a}", s3_server.options()).list() == []


@pytest.mark.slow  # starts SeaweedFS
def test_stop_leaves_no_process_socket_or_folder():
    with S3Server(startup_timeout_s=60) as server:
        pid, tmp, ports = server.pid, server._tmp, dict(server.ports)
        assert server.secret not in server.log_tail(100_000)
        Store(f"s3://{server.new_bucket()}", server.options()).write_bytes("k", b"v")
        assert all(c.laddr.ip == "127.0.0.1" for c in psutil.Process(pid).net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN)
    assert pid is not None and not psutil.pid_exists(pid)
    assert tmp is not None and not os.path.exists(tmp)
    leftovers = [p for port in ports.values() for p in Path("/tmp").glob(f"seaweedfs-*-{port}.sock")]
    assert leftovers == []


def test_ports_and_arguments_are_checked():
    ports = pick_weed_ports()
    assert all(p + 10000 <= 65535 for p in ports.values())
    with pytest.raises(ValueError):
        S3Server(port=60000)
    with pytest.raises(ValueError):
        S3Server(startup_timeout_s=0)


def test_moto_server_round_trip(moto_s3):
    store = Store(f"s3://{moto_s3.new_bucket()}/p", moto_s3.options(), ONE_TRY)
    store.write_bytes("x.bin", b"123")
    assert store.read("x.bin") == b"123"


@pytest.mark.slow  # starts SeaweedFS
@pytest.mark.timeout(120)
def test_cli_prints_exports_and_stops_on_sigterm():
    proc = subprocess.Popen([sys.executable, "-m", "tools.s3_server"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=Path(__file__).parents[2])
    try:
        lines = []
        while not any("Ctrl-C" in line for line in lines):
            line = proc.stdout.readline()
            assert line, f"server CLI ended early: {''.join(lines)}"
            lines.append(line)
        text = "".join(lines)
        assert "export AWS_ENDPOINT_URL=http://127.0.0.1:" in text
        assert "export AWS_ACCESS_KEY_ID=" in text and "export AWS_SECRET_ACCESS_KEY=" in text
        weed = [c for c in psutil.Process(proc.pid).children(recursive=True)]
        assert weed
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        proc.stdout.close()
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in weed)


@pytest.mark.slow  # starts SeaweedFS
def test_startup_timeout_names_the_endpoint_and_shows_the_log():
    server = S3Server(startup_timeout_s=0.05)
    with pytest.raises(TimeoutError, match=r"did not answer within .* log tail:") as err:
        server.start()
    assert "127.0.0.1" in str(err.value) and server.secret not in str(err.value)
    assert server.pid is None  # stopped and cleaned up on the way out


def test_busy_port_is_reported_and_nothing_is_left(tmp_path):
    import socket

    with socket.socket() as busy:
        port = pick_weed_ports()["master"]  # free, and low enough for weed's +10000 gRPC twins
        busy.bind(("127.0.0.1", port))
        server = S3Server(port=port - 1)  # its master port (port) is taken
        with pytest.raises(OSError, match="not all free"):
            server.start()
    assert server._tmp is None and server.pid is None
