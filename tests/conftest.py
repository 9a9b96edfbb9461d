"""Shared fixtures: real S3 endpoints (SeaweedFS, moto), guards against leaked threads/processes
and against unmarked server tests (the `slow` marker decides what `make test-fast` skips)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from tests.clouds import Cloud
from tools.cloud_servers import AzuriteServer, EmulatorUnavailable, GcsServer
from tools.s3_server import MotoS3Server, S3Server

# Threads that libraries start once and keep for the life of the process, by name prefix:
# fsspec's event-loop thread and its default executor, pytest-timeout's watchdog.
# dataio-hedge: the losing request of a hedged read is not waited for (dataio/storage/hedge.py: the
# first result wins, the others run out on their own, bounded by the store's read timeout); on a
# loaded machine a loser can outlive the grace below.
# dataio-s3-parts: the part threads of S3 reads (dataio/storage/threads.py) wait for the next read and end
# only after IDLE_S idle (hedged requests' threads too, named dataio-hedge).
# gcsfs-deferred-close: gcsfs's one worker per process that closes files without blocking the event loop.
_KNOWN_THREAD_PREFIXES = ("fsspecIO", "asyncio_", "pytest_timeout", "ThreadPoolExecutor-fsspec", "dataio-hedge",
                          "dataio-s3-parts", "gcsfs-deferred-close")
# Per-connection handler threads of threaded HTTP servers (moto's werkzeug) live as long as a
# pooled client keeps its connection open; they belong to the session server, not the test.
_KNOWN_THREAD_PARTS = ("process_request_thread",)
# Helper processes multiprocessing starts once and keeps (spawn/forkserver start methods).
_KNOWN_PROCESS_PARTS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
_GRACE_S = 3.0

# Processes of session-scoped servers: never leaks, whenever a test first asks for them.
_SESSION_PIDS: set[int] = set()


# Fixtures that start a server subprocess: every test using one (directly or through another
# fixture) is marked `slow`, so `make test-fast` (-m "not slow") never starts one.
SERVER_FIXTURES = frozenset({"s3_server", "gcs_server", "azure_server", "cloud"})

# Programs the test process started while the current test ran (the audit hook below appends).
_STARTED: list[str] = []
_WATCHING = [False]


def _audit(event: str, args: tuple) -> None:
    # Every subprocess.Popen (SeaweedFS, torchrun, Ray's daemons, `python -m ...`) raises this event,
    # from any thread. Forked or spawned multiprocessing workers do not: they are not servers.
    if event == "subprocess.Popen" and _WATCHING[0]:
        _STARTED.append(" ".join(str(a) for a in (args[1] or [args[0]]))[:200])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "allow_leaks: do not fail this test for threads or child processes it leaves behind"
    )
    sys.addaudithook(_audit)  # stays for the process; does nothing unless _WATCHING
    if int(getattr(config, "workerinput", {}).get("workercount", 1)) > 1:
        _one_torch_thread()


def _one_torch_thread() -> None:
    """On several processes (cores + 1 on the cores), each test process and what it starts computes on
    one torch thread. Intra-op threads there only contend: OpenMP's threads spin while a peer waits for
    a core. Measured: ResNet on digits in a process beside two busy loops, 21.4 CPU-s with torch's 2
    threads, 14.4 with one (and sooner). Tests that set threads themselves (--num-threads) still do."""
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the markers added here count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `slow` every test that uses a server fixture. On several processes (`-n`), deal the slow
    ones first: xdist's worksteal gives each process a contiguous share of this order, so each share
    starts with its part of the slow tests (dealt round-robin) and ends with short ones; the long
    tests start early and the short ones fill the end."""
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers > 1:
        slow = [i for i in items if i.get_closest_marker("slow") is not None]
        fast = [i for i in items if i.get_closest_marker("slow") is None]
        items[:] = [i for k in range(workers) for i in (*slow[k::workers], *fast[k::workers])]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Watch for programs started by a test not marked `slow`, from its fixtures' set-up on (a
    module or session fixture that starts a server counts for the first test that needs it)."""
    _STARTED.clear()
    _WATCHING[0] = item.get_closest_marker("slow") is None


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (make test): one test process per core plus one, at most 8. The suite is mostly
    programs it starts (torchrun ranks, servers) and their waits; one more process than cores fills
    the waits, and each process starts its own session servers (SeaweedFS, the emulators)."""
    return min(8, len(os.sched_getaffinity(0)) + 1)


@pytest.fixture(autouse=True)
def no_unmarked_subprocesses() -> Iterator[None]:
    """Fail a test not marked `slow` that starts a program (a server, torchrun, the CLI in a new
    interpreter): it would make the fast tier slow. Its marker belongs on the test."""
    yield
    _WATCHING[0] = False
    started, _STARTED[:] = list(_STARTED), []
    if started:
        pytest.fail("a test not marked slow started a subprocess; mark it @pytest.mark.slow so that "
                    "`make test-fast` skips it (it still runs in `make test`):\n  " + "\n  ".join(started),
                    pytrace=False)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real SeaweedFS S3 server on 127.0.0.1 for the whole session; use .new_bucket() per test."""
    with S3Server() as server:
        assert server.pid is not None
        _SESSION_PIDS.add(server.pid)
        yield server
    _SESSION_PIDS.discard(server.pid or -1)


def _emulator(server_type: type) -> Iterator[object]:
    try:
        server = server_type()
        server.start()
    except EmulatorUnavailable as exc:
        pytest.skip(str(exc))
    assert server.pid is not None
    _SESSION_PIDS.add(server.pid)
    try:
        yield server
    finally:
        _SESSION_PIDS.discard(server.pid or -1)
        server.stop()


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsServer]:
    """fake-gcs-server on 127.0.0.1 for the whole session; use .new_bucket() per test."""
    yield from _emulator(GcsServer)  # type: ignore[misc]


@pytest.fixture(scope="session")
def azure_server() -> Iterator[AzuriteServer]:
    """Azurite's blob service on 127.0.0.1 for the whole session; skipped where set-up could not install it."""
    yield from _emulator(AzuriteServer)  # type: ignore[misc]


@pytest.fixture(params=["s3", "gcs", "azure"])
def cloud(request: pytest.FixtureRequest) -> Cloud:
    """Each object store in turn (SeaweedFS, fake-gcs-server, Azurite), one server per scheme per session."""
    fixture = {"s3": "s3_server", "gcs": "gcs_server", "azure": "azure_server"}[request.param]
    return Cloud(request.param, request.getfixturevalue(fixture))


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3Server]:
    """moto's threaded S3 server on 127.0.0.1 (fast, accepts any credentials); same interface."""
    with MotoS3Server() as server:
        yield server


def _thread_known(thread: threading.Thread) -> bool:
    name = thread.name or ""
    return name.startswith(_KNOWN_THREAD_PREFIXES) or any(p in name for p in _KNOWN_THREAD_PARTS)


def _process_known(proc: psutil.Process) -> bool:
    try:
        if proc.pid in _SESSION_PIDS or proc.status() == psutil.STATUS_ZOMBIE:
            return True  # a zombie holds nothing but a pid; whoever made it may still reap it
        cmdline = " ".join(proc.cmdline())
        return any(part in cmdline for part in _KNOWN_PROCESS_PARTS) or any(
            parent.pid in _SESSION_PIDS for parent in proc.parents()
        )
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return True  # gone already


def _children() -> set[psutil.Process]:
    try:
        return set(psutil.Process().children(recursive=True))
    except psutil.Error:
        return set()


def _leaks(
    threads_before: set[threading.Thread], procs_before: set[psutil.Process]
) -> tuple[list[threading.Thread], list[psutil.Process]]:
    threads = [t for t in threading.enumerate() if t not in threads_before and t.is_alive() and not _thread_known(t)]
    procs = [p for p in _children() - procs_before if not _process_known(p)]
    return threads, procs


def _describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {proc.pid}"


def _kill(procs: list[psutil.Process]) -> None:
    """Terminate, then kill, leaked descendants so the next test starts clean."""
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=3)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass


@pytest.fixture(autouse=True)
def no_leaked_threads_or_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test if it leaves new threads or child processes running (after a short grace)."""
    threads_before = set(threading.enumerate())
    procs_before = _children()
    yield
    if request.node.get_closest_marker("allow_leaks"):
        return
    deadline = time.monotonic() + _GRACE_S
    threads, procs = _leaks(threads_before, procs_before)
    while (threads or procs) and time.monotonic() < deadline:
        time.sleep(0.05)
        threads, procs = _leaks(threads_before, procs_before)
    if threads or procs:
        lines = [f"thread {t.name!r} (daemon={t.daemon})" for t in threads]
        lines += [_describe(p) for p in procs]
        _kill(procs)
        pytest.fail(
            "test left threads or child processes running after a "
            f"{_GRACE_S:.0f} s grace period (stop/join them, or close the object that owns them):\n  "
            + "\n  ".join(lines),
            pytrace=False,
        )
