"""Worker processes for `shardify write`: each writes whole shards; interrupts and a dead parent stop them cleanly.

A worker that gets SIGINT or SIGTERM while writing lets `Store.open_atomic` remove its temporary
file, then exits; an idle one exits at once. A watchdog thread notices when the parent is gone
(kill -9) and stops the worker the same way, so no orphan keeps writing.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from dataio.storage.store import Store
from sharding.config import Layout, ShardResult, WriteConfig
from sharding.shard import write_shard
from sharding.sources.base import Ref, Source

_WORKER: dict[str, Any] = {}
INTERRUPTED = 130  # a worker's exit code after SIGINT or SIGTERM (the shell's code for Ctrl-C)


def _stop_on_signal(signum: int, frame: Any) -> None:
    if not _WORKER.get("busy"):
        os._exit(INTERRUPTED)  # idle: nothing to clean up
    # Once only: a second signal (Ctrl-C, then the parent's SIGTERM) must not cut the cleanup short.
    # A no-op handler, not SIG_IGN: a signal already pending would then raise OSError instead.
    signal.signal(signal.SIGINT, _ignore_signal)
    signal.signal(signal.SIGTERM, _ignore_signal)
    raise KeyboardInterrupt


def _ignore_signal(signum: int, frame: Any) -> None:
    return None


def _watch_parent(parent: int) -> None:
    # A parent killed with -9 cannot stop us: notice it and leave (after removing temp files).
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
            return


def _init_worker(queue: Any, source: Source, dest: Store, config: WriteConfig, layout: Layout) -> None:
    signal.signal(signal.SIGTERM, _stop_on_signal)
    signal.signal(signal.SIGINT, _stop_on_signal)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    _WORKER.update(queue=queue, source=source, dest=dest, config=config, layout=layout)


def _run_task(task: tuple[int, str, list[Ref]]) -> ShardResult:
    w = _WORKER
    w["busy"] = True
    try:
        return write_shard(task, w["source"], w["dest"], w["config"], w["layout"],
                           lambda n, b: w["queue"].put((n, b)))
    except KeyboardInterrupt:
        os._exit(INTERRUPTED)  # open_atomic already removed the temporary file
    finally:
        w["busy"] = False


def _mp_context() -> Any:
    # fork starts workers in milliseconds (spawn re-imports pyarrow & co. per worker: seconds).
    # It is safe for s3fs because each worker gets fresh Stores (see _fresh) and opens its own
    # client, and fsspec resets its event loop and instance cache in a forked child.
    return mp.get_context("fork" if os.name == "posix" else "spawn")


def _fresh(obj: Any) -> Any:
    """A copy without any open filesystem client (Store drops its client when pickled)."""
    return pickle.loads(pickle.dumps(obj))


def run_parallel(tasks: list[tuple[int, str, list[Ref]]], source: Source, dest: Store, config: WriteConfig,
                 layout: Layout, progress: Any) -> list[ShardResult]:
    """Write `tasks` (shard number, path, refs) on worker processes; on any error or interrupt stop them all."""
    from sharding.progress import QueueDrain

    ctx = _mp_context()
    queue = ctx.Queue()
    drain = QueueDrain(queue, progress)
    pool = ProcessPoolExecutor(min(config.num_workers, len(tasks)), mp_context=ctx, initializer=_init_worker,
                               initargs=(queue, _fresh(source), _fresh(dest), config, layout))
    try:
        pending = {pool.submit(_run_task, t) for t in tasks}
        results = []
        while pending:
            finished, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for fut in finished:
                results.append(fut.result())  # re-raises a worker's error here
                progress.log_shard(results[-1])
        pool.shutdown(wait=True)
        return results
    except BaseException as exc:
        # No fut.cancel() here: Python 3.11's pool then fails on the cancelled futures when it
        # notices the terminated workers (InvalidStateError in its manager thread).
        procs = list((getattr(pool, "_processes", None) or {}).values())
        for proc in procs:
            proc.terminate()  # workers remove their temporary files on SIGTERM, then exit
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        pool.shutdown(wait=True)
        if isinstance(exc, BrokenProcessPool) and any(p.exitcode == INTERRUPTED for p in procs):
            # Ctrl-C reaches the whole process group: a worker that left on it can break the pool
            # before this process runs its own handler. That is an interrupt, not a dead worker; the
            # handler may still run, so it becomes a no-op: a second KeyboardInterrupt in the cleanup
            # that follows (closing the source's generators) would print a traceback.
            signal.signal(signal.SIGINT, _ignore_signal)
            raise KeyboardInterrupt from exc
        raise
    finally:
        drain.stop()
