"""`shardify write` to SeaweedFS through faults (issue 19): 503s on PUT outlasted within the default
retry budget, and a resumed write that prints no aiobotocore "Task exception was never retrieved"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dataio.format.manifest import read_manifest
from dataio.storage.store import RetryPolicy, Store
from tests.sharding.conftest import ctrl_c_reaches_it, make_image_folder, run
from tools.delay_proxy import DelayProxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]


def _flags(server, endpoint: str) -> list[str]:
    return ["--endpoint-url", endpoint, "--access-key", server.key, "--secret-key", server.secret,
            "--region", "us-east-1"]


def test_write_through_put_503s_completes_within_the_default_budget(s3_server, image_folder: Path, capsys) -> None:
    url = f"s3://{s3_server.new_bucket()}/ds"
    # The first 5 PUTs fail (one object needs a 6th try: before, it gave up after 5), then 10% of them.
    with DelayProxy(s3_server.endpoint_url, 0.0, error_rate=0.1, error_first=5, methods=("PUT", "POST"),
                    seed=4) as proxy:
        code = run("write", image_folder, url, "--max-samples-per-shard", 4, "--workers", 1, "--quiet",
                   *_flags(s3_server, proxy.url))
        assert proxy.stats.num_errors > 5
    assert code == 0, capsys.readouterr().err
    store = Store(url, s3_server.options())
    assert read_manifest(store).num_samples == 24  # published, naming every sample
    assert run("verify", url, "--quiet", *_flags(s3_server, s3_server.endpoint_url)) == 0  # each object whole


def test_the_retry_budget_flag_is_checked(image_folder: Path, capsys) -> None:
    for bad in ("0", "-3", "soon"):
        assert run("write", image_folder, "s3://b/ds", "--retry-budget", bad) == 2
        assert "--retry-budget" in capsys.readouterr().err


def _env(server) -> dict[str, str]:
    return {**os.environ, "AWS_ACCESS_KEY_ID": server.key, "AWS_SECRET_ACCESS_KEY": server.secret}


def _shards_out(store: Store) -> int:
    try:
        return sum(p.endswith(".tar") for p in Store(store.raw_url, store.options, RetryPolicy(max_attempts=1)).list())
    except Exception:  # noqa: BLE001 - nothing there yet
        return 0


def test_a_resumed_write_to_s3_prints_no_task_exception(s3_server, tmp_path: Path) -> None:
    images = make_image_folder(tmp_path / "images", per_class=10)
    url = f"s3://{s3_server.new_bucket()}/ds"
    write = [sys.executable, "-m", "sharding.cli", "write", str(images), url, "--max-samples-per-shard", "1",
             "--workers", "2", "--journal-every", "0.1"]
    store = Store(url, s3_server.options())
    with DelayProxy(s3_server.endpoint_url, delay_s=0.1) as proxy:  # slow enough to interrupt mid-write
        proc = subprocess.Popen([*write, "--quiet", "--endpoint-url", proxy.url], env=_env(s3_server), cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                preexec_fn=ctrl_c_reaches_it)
        deadline = time.monotonic() + 60
        while _shards_out(store) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        first = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, first  # interrupted, not finished
    resumed = subprocess.run([*write, "--resume", "--endpoint-url", s3_server.endpoint_url], env=_env(s3_server),
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert read_manifest(store).num_samples == 30
    assert "never retrieved" not in resumed.stderr and "Traceback" not in resumed.stderr, resumed.stderr
