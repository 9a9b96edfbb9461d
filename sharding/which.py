"""`shardify which RUN_DIR_OR_CHECKPOINT --step N [--rank R]`: the samples behind optimizer step N.

The work is dataio/loader/which.py's (shared with `python -m trainer.which`); this adds the
subcommand and prints its lines.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from dataio.loader.which import add_which_arguments, run_which
from dataio.storage.store import StorageOptions


def add_which_parser(sub: Any, storage_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    """The `which` subcommand with its flags and the storage flags."""
    w = sub.add_parser("which", help="name the samples (keys, labels, shards, source files) of a training "
                                     "run's optimizer step, computed from a checkpoint's loader state")
    add_which_arguments(w)
    storage_flags(w)


def which_command(args: argparse.Namespace, options: StorageOptions) -> int:
    """Print every requested rank's samples of the step; errors propagate to the CLI (exit 2)."""
    print("\n".join(run_which(args, options)))
    return 0
