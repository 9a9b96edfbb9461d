"""Worker processes for `shardify write`: each writes whole shards; interrupts and a dead parent stop them cleanly.

Only the main process decides to stop. Workers ignore SIGINT (Ctrl-C reaches the whole process
group; a worker that left on it first would look like a dead worker), and the main process,
on KeyboardInterrupt or any error, sends each worker SIGTERM. A worker that gets SIGTERM while
writing lets `Store.open_atomic` remove its temporary file (or abort its upload; where the stop
came before the block could own the file, dataio/storage/temps.py removes it), then exits 130;
an idle one exits at once. A watchdog thread notices when the parent is gone (kill -9) and stops
the worker the same way, so no orphan keeps writing.

The stop is raised as KeyboardInterrupt wherever the worker is. Where that is a finalizer (a
generator closed by the garbage collector, a weakref callback), Python swallows the exception:
the stop is then recorded, kept quiet (no "Exception ignored" traceback) and raised again at the
next sample, or the worker exits once its shard is whole.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from dataio.storage.temps import remove_open
from sharding.write.config import ProgressSink, ShardResult, ShardTask, WriteJob
from sharding.write.shard import write_shard

_WORKER: dict[str, Any] = {}
INTERRUPTED = 130  # a worker's exit code after SIGINT or SIGTERM (the shell's code for Ctrl-C)


def _stop_on_signal(signum: int, frame: Any) -> None:
    _WORKER["stop"] = True
    if not _WORKER.get("busy"):
        os._exit(INTERRUPTED)  # idle: nothing to clean up
    # Once only: a second SIGTERM (the parent's, then the watchdog's) must not cut the cleanup short.
    # A no-op handler, not SIG_IGN: a signal already pending would then raise OSError instead.
    signal.signal(signal.SIGTERM, _ignore_signal)
    raise KeyboardInterrupt


def _ignore_signal(signum: int, frame: Any) -> None:
    return None


def _check_stop() -> None:
    """Raise the stop again where a finalizer swallowed it (see the module's docstring)."""
    if _WORKER.get("stop"):
        raise KeyboardInterrupt


def _quiet_stop(unraisable: Any) -> None:
    if _WORKER.get("stop") and isinstance(unraisable.exc_value, KeyboardInterrupt):
        return  # our own stop, raised inside a finalizer; _check_stop raises it again
    sys.__unraisablehook__(unraisable)


def _watch_parent(parent: int) -> None:
    # A parent killed with -9 cannot stop us: notice it and leave (after removing temp files).
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
            return


def _init_worker(queue: Any, job: WriteJob) -> None:
    signal.signal(signal.SIGTERM, _stop_on_signal)
    # SIGINT came blocked from the parent (see _sigint_blocked): ignoring it discards a Ctrl-C
    # that arrived before this point, so no worker ever raises KeyboardInterrupt on its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    sys.unraisablehook = _quiet_stop
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    _WORKER.update(queue=queue, job=job)


def _run_task(task: ShardTask) -> ShardResult:
    w = _WORKER
    w["busy"] = True

    def report(num: int, num_bytes: int) -> None:
        _check_stop()
        w["queue"].put((num, num_bytes))

    try:
        # durable=False: the parent fsyncs each batch of shards before its journal names them
        result = write_shard(w["job"], task, report, durable=False)
        _check_stop()  # stopped while finishing: this shard is whole, the next one is not started
        return result
    except KeyboardInterrupt:
        # open_atomic removed its temporary file, unless the stop came between its generator yielding
        # the file and the `with` taking it (no `finally` then runs before os._exit): remove it here.
        remove_open()
        os._exit(INTERRUPTED)
    finally:
        w["busy"] = False


class QueueDrain:
    """A thread that moves (samples, bytes) tuples from a multiprocessing queue into a Progress."""

    def __init__(self, queue: Any, progress: ProgressSink) -> None:
        self._queue, self._progress = queue, progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress-drain", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import queue as queue_mod

        while not self._stop.is_set():
            try:
                self._progress.update(*self._queue.get(timeout=0.1))
            except queue_mod.Empty:
                continue
            except (EOFError, OSError):
                return  # the queue was closed under us

    def stop(self) -> None:
        """Stop the thread and close the queue (the parent never puts, so no feeder thread lingers)."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._queue.close()
        self._queue.join_thread()


def _mp_context() -> Any:
    # fork starts workers in milliseconds (spawn re-imports pyarrow & co. per worker: seconds).
    # It is safe for s3fs because each worker gets fresh Stores (see _fresh) and opens its own
    # client, and fsspec resets its event loop and instance cache in a forked child.
    return mp.get_context("fork" if os.name == "posix" else "spawn")


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """Hold SIGINT back from this thread while workers are forked: a fork inherits the mask, so a
    Ctrl-C cannot reach a worker before its initializer ignores SIGINT; here it arrives on exit."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _fresh(obj: Any) -> Any:
    """A copy without any open filesystem client (Store drops its client when pickled)."""
    return pickle.loads(pickle.dumps(obj))


def run_parallel(job: WriteJob, tasks: list[ShardTask], progress: ProgressSink) -> list[ShardResult]:
    """Write `tasks` on worker processes; on any error or interrupt stop them all."""
    ctx = _mp_context()
    queue = ctx.Queue()
    drain = QueueDrain(queue, progress)
    pool = ProcessPoolExecutor(min(job.config.num_workers, len(tasks)), mp_context=ctx, initializer=_init_worker,
                               initargs=(queue, _fresh(job)))
    try:
        with _sigint_blocked():  # the first submit forks every worker (the fork context starts them all)
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
            # A worker stopped by SIGTERM from outside (a process manager stopping the group) broke
            # the pool: that is an interrupt, not a dead worker. A SIGINT still to come becomes a
            # no-op: a second KeyboardInterrupt in the cleanup that follows would print a traceback.
            signal.signal(signal.SIGINT, _ignore_signal)
            raise KeyboardInterrupt from exc
        raise
    finally:
        drain.stop()
