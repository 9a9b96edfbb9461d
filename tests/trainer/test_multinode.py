"""Multi-node for real: two torchrun launchers on this machine act as two nodes (c10d rendezvous)."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.trainer.harness import REPO, TORCHRUN, env_for, finish, kill_group, ok, summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch_pair(out) -> list:
    port = _free_port()
    launch = [TORCHRUN, "--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=multinode-test", "--max-restarts=0",
              "--monitor-interval=0.2", "-m", "trainer", "--data", "synthetic:?samples=400&classes=4",
              "--batch-size", "8", "--image-size", "8", "--epochs", "1", "--log-every", "5",
              "--out", str(out), "--resume", "none", "--dist-timeout-s", "60", "--no-live"]
    procs = [subprocess.Popen(launch, cwd=REPO, env=env_for(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True) for _ in range(2)]
    try:
        return [finish(p, timeout_s=120) for p in procs]
    finally:
        for p in procs:
            kill_group(p)


def test_two_launchers_as_two_nodes_train_to_the_end(tmp_path):
    out = tmp_path / "out"
    results = _launch_pair(out)
    # The free port is found by binding and closing; another process may take it before the
    # rendezvous binds it (a race of the test, not of the trainer): then once more on a new port.
    if any(r.returncode != 0 and "address already in use" in r.stderr.lower() for r in results):
        out = tmp_path / "out-retry"
        results = _launch_pair(out)
    for r in results:
        ok(r)
    rep = summary(out)  # both nodes share this machine's disk: rank 0 wrote it
    assert rep["world_size"] == 2 and rep["job"]["num_nodes"] == 2
    assert sorted((r["node"], r["local_rank"]) for r in rep["ranks"]) == [(0, 0), (1, 0)]
    assert rep["steps"] == 400 // 16 - 1  # trained to the end of the epoch (the first step is start-up)
    printed = "".join(r.stdout for r in results)
    assert "(node 1, local 0)" in printed and "(node 0, local 0)" in printed
