"""`shardify write --engine ray`: the same planned shards, written as Ray tasks on a local Ray or a cluster.

The driver plans exactly as the local engine does (which samples go to which shard, and each
shard's name, from the source and the seed alone) and sends one task per shard; a task runs the
same `write_shard`, which publishes the shard and its index atomically under the planned name.
Ray retries a task whose worker or node died (`max_retries`); the retry rewrites the same names
with the same bytes, so nothing is duplicated, and the driver keeps exactly one result per shard
number. The manifest is written by the driver, once, last, and only when every task succeeded.

A local Ray started for the run listens on 127.0.0.1 only, without dashboard or usage
statistics (RAY_USAGE_STATS_ENABLED=0), and stops when the write ends; `--ray-address` joins an
existing cluster instead (which must reach the source and destination URLs itself).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from dataio.errors import ShardifyError
from dataio.storage.store import Store, redact
from sharding.write.config import ProgressSink, ShardResult, ShardTask, WriteJob
from sharding.write.shard import write_shard

MAX_RETRIES = 3  # per task, for a worker or node that died; a data error is not retried


class RayEngineError(ShardifyError):
    """A Ray task failed for good, or the cluster went away; no manifest was written."""


def _write_task(job: WriteJob, task: ShardTask) -> ShardResult:
    return write_shard(job, task, lambda num_samples, num_bytes: None)


def start_ray(address: str | None, num_cpus: int) -> bool:
    """Join `address`, or start a local Ray for this run; True when it was started here (stop it after)."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before ray reads it: no usage report leaves the machine
    if not address:
        # Ray resolves 127.0.0.1 to the machine's routable address unless it runs single-machine
        # (read when ray is first imported): then every Ray service is started on loopback.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    try:
        import ray
    except ImportError:
        raise ShardifyError("--engine ray needs Ray: pip install 'shardify[ray]' (or pip install ray)") from None
    if ray.is_initialized():
        return False  # the caller's own Ray session
    quiet: dict[str, Any] = {"include_dashboard": False, "configure_logging": False, "log_to_driver": False}
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            ray.init(num_cpus=num_cpus, _node_ip_address="127.0.0.1", **quiet)
    except Exception as exc:  # noqa: BLE001 - ray raises ConnectionError, RuntimeError, ...
        raise RayEngineError(f"cannot start or reach Ray ({'address ' + address if address else 'local'}): "
                             f"{redact(str(exc))}; check --ray-address, or drop it to start a local Ray") from None
    return True


def run_ray(job: WriteJob, tasks: list[ShardTask], progress: ProgressSink) -> list[ShardResult]:
    """Write `tasks` as Ray tasks (on `job.config.ray_address`, or a local Ray started for the run); one
    result per shard number, or an error naming the task."""
    import ray

    started = start_ray(job.config.ray_address, job.config.num_workers)
    try:
        remote = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(_write_task)
        shared = ray.put(job)  # once, not per task
        pending = {remote.remote(shared, task): task for task in tasks}
        results: dict[int, ShardResult] = {}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    task = pending.pop(ref)
                    result = _get(ray, ref, task)
                    results[result.index] = result  # a retried task replaces nothing: one entry per shard
                    progress.update(result.num_samples, result.num_bytes)
                    progress.log_shard(result)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        assert sorted(results) == [t.index for t in tasks], "every shard exactly once"
        _remove_orphans(job.dest, tasks)
        return [results[t.index] for t in tasks]
    finally:
        if started:
            ray.shutdown()


def _remove_orphans(dest: Store, tasks: list[ShardTask]) -> None:
    """Delete the temporary files of attempts whose worker died mid-shard (local disk only: an S3
    upload that never completed leaves no object)."""
    if not dest.is_local:
        return
    for directory in sorted({t.path.rsplit("/", 1)[0] for t in tasks if "/" in t.path}):
        path = dest.path(directory)
        for name in os.listdir(path) if os.path.isdir(path) else ():
            if name.startswith(".") and ".tmp-" in name:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(path, name))


def _get(ray: Any, ref: Any, task: ShardTask) -> ShardResult:
    """The task's result; its own error re-raised as is, Ray's failures as RayEngineError naming the shard."""
    from ray.exceptions import RayError, RayTaskError

    try:
        return ray.get(ref)
    except RayTaskError as exc:
        cause = exc.cause if isinstance(exc.cause, BaseException) else None
        if isinstance(cause, (ShardifyError, ValueError, OSError)):
            raise cause from None  # a bad sample or storage error: the same message as the local engine's
        raise RayEngineError(f"Ray task for shard {task.index} ({task.path}) failed: {redact(str(exc))[:2000]}") from None
    except RayError as exc:
        raise RayEngineError(
            f"Ray task for shard {task.index} ({task.path}) was lost after {MAX_RETRIES} retries or the cluster went "
            f"away ({type(exc).__name__}: {redact(str(exc))[:500]}); no manifest was written: rerun with --overwrite"
        ) from None
