"""Progress for long commands: a tqdm bar (samples/s, MB/s, ETA) on a terminal, plain log lines otherwise.

Worker processes report (samples, bytes) through a queue that a thread in the parent drains into
the bar (sharding/write/parallel.py), so the bar moves within a shard, not only when a shard completes.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO


def bar_class() -> Any:
    from tqdm import tqdm

    class Bar(tqdm):  # type: ignore[misc, valid-type]
        monitor_interval = 0  # no monitor thread left running after the command

    return Bar


class Progress:
    """Counts samples and bytes; draws a bar when `stream` is a terminal and `quiet` is off."""

    def __init__(self, *, total_samples: int, total_bytes: int, what: str, quiet: bool,
                 stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.samples = 0
        self.bytes = 0
        self.total_samples, self.total_bytes = total_samples, total_bytes
        self.start = time.perf_counter()
        self.quiet = quiet
        self._lock = threading.Lock()
        self._bar: Any = None
        self._bytes_bar: Any = None
        if not quiet and self.stream.isatty():
            tqdm = bar_class()
            self._bar = tqdm(total=total_samples, desc=what, unit="sample", file=self.stream,
                             dynamic_ncols=True, smoothing=0.1, position=0)
            self._bytes_bar = tqdm(total=total_bytes, desc="bytes", unit="B", unit_scale=True,
                                   unit_divisor=1024, file=self.stream, dynamic_ncols=True, position=1)

    def update(self, samples: int, num_bytes: int) -> None:
        with self._lock:
            self.samples += samples
            self.bytes += num_bytes
            if self._bar is not None:
                self._bar.update(samples)
                self._bytes_bar.update(num_bytes)

    def log(self, line: str) -> None:
        """A plain log line (written above the bar when there is one)."""
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def log_shard(self, result: Any) -> None:
        """One line per finished shard, for logs (the bar already shows it on a terminal)."""
        if self._bar is None and not self.quiet:
            self.log(f"wrote {result.path}: {result.num_samples} samples, {result.num_bytes} bytes"
                     + (f", {len(result.skipped)} skipped" if result.skipped else ""))

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start

    def summary(self) -> str:
        s = max(self.elapsed_s, 1e-9)
        return (f"{self.samples} samples, {self.bytes / 1e6:.1f} MB in {s:.1f} s "
                f"({self.samples / s:.0f} samples/s, {self.bytes / 1e6 / s:.1f} MB/s)")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bytes_bar.close()
            self._bar = None
