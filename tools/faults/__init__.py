"""The fault-injection suite, one module per scenario group (loader, write, corrupt, training) and
the runner (suite.py, its usage); `python -m tools.faults` runs it."""

from tools.faults.common import FULL, SHORT, Row, Size, write_raw_dataset
from tools.faults.suite import main, run_suite, to_markdown
from tools.faults.training import rank_pid

__all__ = ["FULL", "SHORT", "Row", "Size", "main", "rank_pid", "run_suite", "to_markdown", "write_raw_dataset"]
