"""`shardify write` to S3 through failing requests, and killed mid-write: a complete dataset or a
clean failure, never a manifest over a partial one."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dataio.storage.store import Store
from tools.delay_proxy import DelayProxy
from tools.faults.common import (Row, Size, env, faults_seen, judge_write, make_image_folder, s3_flags, safe_list,
                                 shardify)


WRITE_FAULTS: list[tuple[str, dict[str, Any]]] = [
    ("10% of PUTs 503", {"error_rate": 0.1, "methods": ("PUT", "POST")}),
    ("10% of PUTs reset", {"reset_rate": 0.1, "methods": ("PUT", "POST")}),
    ("10% truncated responses", {"truncate_rate": 0.1, "methods": ("GET", "PUT", "POST", "HEAD")}),
    ("5% 2-second stalls", {"stall_rate": 0.05, "stall_s": 2.0, "methods": ("GET", "PUT", "POST", "HEAD")}),
    ("every PUT 503", {"error_rate": 1.0, "methods": ("PUT", "POST")}),
]
# Retries spend the whole budget (120 s by default) before a refusal that never ends is reported:
# the permanent fault gets a short one, so the suite shows the clean failure without the wait.
WRITE_FLAGS: dict[str, list[str]] = {"every PUT 503": ["--retry-budget", "5"]}


def write_scenarios(server: Any, size: Size, workdir: Path, seed: int) -> list[Row]:
    """`shardify write` to S3 through each fault: complete or a clean failure, never a false success."""
    images = make_image_folder(workdir / "images", size.images, seed=seed)
    rows = []
    for name, faults in WRITE_FAULTS:
        bucket = server.new_bucket()
        with DelayProxy(server.endpoint_url, delay_s=0.0, seed=seed, **faults) as proxy:
            start = time.perf_counter()
            result = shardify(["write", str(images), f"s3://{bucket}/ds", "--max-samples-per-shard", "8",
                               "--workers", "1", "--quiet", *WRITE_FLAGS.get(name, []),
                               *s3_flags(server, proxy.url)])
            seconds = time.perf_counter() - start
        outcome, ok = judge_write(result.returncode, Store(f"s3://{bucket}/ds", server.options()), size.images)
        rows.append(Row(group="write", scenario=f"shardify write through {name}",
                        figure=f"{outcome}, exit {result.returncode}, {seconds:.1f} s", passed=ok,
                        note=f"{faults_seen(proxy)}" + ("" if ok else f"; stderr: {result.stderr.strip()[-200:]}")))
    return rows


def _kill_mid_write(images: Path, url: str, flags: list[str], store: Store) -> bool:
    """Start `shardify write`, SIGKILL it once a shard is out; False where it ended before the kill."""
    proc = subprocess.Popen([sys.executable, "-m", "sharding.cli", "write", str(images), url,
                             "--max-samples-per-shard", "1", "--workers", "1", "--quiet", *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env())
    started = time.perf_counter()
    while proc.poll() is None and time.perf_counter() - started < 120:
        if any(p.endswith(".tar") for p in safe_list(store)):
            break
        time.sleep(0.01)
    ended_first = proc.poll() is not None
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return not ended_first


def kill_scenarios(server: Any, size: Size, workdir: Path, seed: int) -> list[Row]:
    """kill -9 of `shardify write` once a shard is out: no manifest over the partial dataset; a rerun completes."""
    images = workdir / "images"
    if not images.exists():
        make_image_folder(images, size.images, seed=seed)
    rows = []
    for where in ("local", "S3"):
        if where == "local":
            url, flags, store = str(workdir / "killed"), [], Store(str(workdir / "killed"))
        else:
            bucket = server.new_bucket()
            url, flags = f"s3://{bucket}/ds", s3_flags(server)
            store = Store(url, server.options())
        # A slow write: 100 ms per request through the proxy on S3, one image per shard locally. A quiet
        # machine may finish a local write before the first shard is seen: that run was not killed
        # mid-write, so the write is tried again over a folder 4x larger (at most 3 times).
        source, killed_mid_write = images, False
        for attempt in range(3):
            with DelayProxy(server.endpoint_url, delay_s=0.1) as proxy:
                if where == "S3":
                    flags = s3_flags(server, proxy.url)
                killed_mid_write = _kill_mid_write(source, url, flags, store)
            if killed_mid_write or where == "S3":
                break
            source = make_image_folder(workdir / f"images-x{4 ** (attempt + 1)}", size.images * 4 ** (attempt + 1),
                                       seed=seed)
            shutil.rmtree(workdir / "killed", ignore_errors=True)
        partial = [p for p in safe_list(store) if p.endswith(".tar")]
        no_manifest = not any(p == "manifest.json" for p in safe_list(store))
        rerun = shardify(["write", str(images), url, "--max-samples-per-shard", "8", "--workers", "1",
                          "--overwrite", "--quiet", *s3_flags(server)] if where == "S3" else
                         ["write", str(images), url, "--max-samples-per-shard", "8", "--workers", "1",
                          "--overwrite", "--quiet"])
        outcome, ok = judge_write(rerun.returncode, store, size.images)
        rows.append(Row(group="kill", scenario=f"kill -9 of shardify write mid-write ({where})",
                        figure=f"{len(partial)} shard(s) out at the kill, manifest: {'none' if no_manifest else 'PRESENT'}; "
                               f"rerun with --overwrite: {outcome}"
                               + ("" if killed_mid_write else "; the write ended before the kill every time"),
                        passed=killed_mid_write and no_manifest and ok,
                        note="" if ok else rerun.stderr.strip()[-200:]))
    return rows
