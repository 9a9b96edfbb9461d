"""Entry point: `torchrun --nproc_per_node=N -m trainer [flags]`, or `python -m trainer` for one process.

Exit codes: 0 done, 2 bad configuration or data (rank 0 prints the message; every rank exits),
3 trained to the end but no checkpoint could be stored (nothing to resume from), 1 a NaN or inf
loss or gradient stopped the run (every rank says which step, rank and samples; trainer/nonfinite.py)
or anything unexpected (its traceback printed with credentials redacted).
"""

from __future__ import annotations

import os
import sys
import traceback

from dataio.errors import ShardifyError
from trainer import runtime
from trainer.flags import parse_config
from trainer.nonfinite import NonFiniteStep
from trainer.redaction import scrub, secrets_of

_SECRETS: list[str] = []  # the credentials of this run's flags and storage options, redacted in messages


def _say(rank0: bool, text: str) -> None:
    if rank0:
        print(f"trainer: error: {scrub(text, tuple(_SECRETS))}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the trainer; an unexpected error's traceback is printed with credentials redacted (exit 1)."""
    _SECRETS[:] = secrets_of(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except Exception:  # noqa: BLE001 - printed redacted instead of Python's own (unredacted) traceback
        print(scrub(traceback.format_exc(), tuple(_SECRETS)), file=sys.stderr, flush=True)
        return 1


def _known_secrets(cfg: object) -> tuple[str, ...]:
    """Key and secret of the run's storage options (flags, --storage-config, AWS_* variables)."""
    from trainer.data import storage_options

    try:
        return storage_options(cfg).secrets  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - a bad storage config is reported by setup, naming it
        return ()


def _main(argv: list[str] | None) -> int:
    """Parse, join the group, set up (all ranks agree it worked), train; returns the exit code."""
    rank0 = os.environ.get("RANK", "0") == "0"
    try:
        cfg = parse_config(argv)
    except ValueError as exc:
        _say(rank0, str(exc))  # every rank parses the same flags, so every rank stops here too
        return 2
    _SECRETS.extend(_known_secrets(cfg))
    try:
        rt = runtime.start(device=cfg.device, timeout_s=cfg.dist_timeout_s)
    except (ValueError, RuntimeError) as exc:
        _say(rank0, f"cannot join the process group: {exc}")
        return 2
    from trainer.train import setup, train, unresumable, wrap

    run = None
    try:
        error = None
        try:
            run = setup(cfg, rt)
        except Exception as exc:  # noqa: BLE001 - any setup failure must reach every rank, not hang them
            error = str(exc) if isinstance(exc, ValueError | OSError) else f"{type(exc).__name__}: {exc}"
        runtime.agree(rt, error)
        assert run is not None
        wrap(run)
        try:
            train(run)
        except NonFiniteStep as exc:  # every rank meets it in the same step (trainer/nonfinite.py)
            run.recorder.event({"kind": "stopped", "why": "nonfinite", "step": run.step + 1, "text": str(exc)})
            _say(True, str(exc))
            return 1
        except (ValueError, ShardifyError) as exc:  # bad data met in training: this rank says which
            _say(True, f"{exc}" + (f" (on rank {rt.rank})" if rt.world_size > 1 else ""))
            return 2
        except RuntimeError as exc:  # a collective timed out or lost a peer: name the rank that stopped
            named = runtime.name_unresponsive(rt, exc)
            if named is None:
                raise
            _say(True, f"{named} (seen from rank {rt.rank})")
            return 2
        failed = unresumable(run)  # the same on every rank: the stored step is gathered after each save
        if failed is not None:
            _say(rt.is_main, failed)
            runtime.barrier(rt)  # rank 0 has said why before any rank exits (torchrun then stops the rest)
            return 3
        return 0
    except runtime.SetupFailed as exc:
        where = f" (on rank {exc.failed_rank})" if rt.world_size > 1 else ""
        _say(rt.is_main, f"{exc.message}{where}")
        return 2
    finally:
        if run is not None:
            from trainer.data import close

            close(run.loader)
            if run.val_loader is not None:
                close(run.val_loader)
        runtime.stop(rt)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without interpreter finalization: at that point torch's C++ threads (gloo, the c10d
    # store) can still be joinable while their objects are destroyed, which aborts a rank that
    # finished cleanly (SIGABRT, "terminate called without an active exception"; seen on about
    # one run in ten here) and makes torchrun report the job as failed. Every file is closed,
    # the loaders are shut down and the process group is destroyed by now.
    os._exit(code)
