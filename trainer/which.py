"""`python -m trainer.which RUN --step N [--rank R]`: the samples behind optimizer step N.

The same code as `shardify which` (dataio/loader/which.py): sharding and trainer never import
each other, so both commands are thin shells around it. Exit 0, or 2 with what to do.
"""

from __future__ import annotations

import argparse
import os
import sys

from dataio.errors import ShardifyError
from dataio.loader.which import add_which_arguments, run_which
from dataio.storage.store import StorageOptions, redact


def main(argv: list[str] | None = None) -> int:
    """Print every rank's samples of the step; errors go to stderr, credentials redacted."""
    parser = argparse.ArgumentParser(prog="python -m trainer.which", description=__doc__.splitlines()[0])
    add_which_arguments(parser)
    args = parser.parse_args(argv)
    try:
        lines = run_which(args, StorageOptions.resolve(env=os.environ))
    except (ShardifyError, ValueError, OSError) as exc:
        print(f"trainer.which: error: {redact(str(exc))}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
