"""The progress display: a bar with rates on a terminal, plain lines in logs, nothing with --quiet."""

from __future__ import annotations

import io

from sharding.progress import Progress
from sharding.write.config import ShardResult


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _shard() -> ShardResult:
    return ShardResult(index=0, path="shards/shard-000000.tar", num_samples=3, num_bytes=2048, checksum="0")


def test_bar_on_a_terminal_shows_samples_bytes_and_eta() -> None:
    stream = _Terminal()
    p = Progress(total_samples=10, total_bytes=10_000, what="write", quiet=False, stream=stream)
    p.update(4, 4000)
    p.log_shard(_shard())  # the bar already shows shards: no extra line
    p.close()
    text = stream.getvalue()
    assert "write" in text and "4/10" in text and "sample/s" in text and "B/s" in text and "<00:00" in text  # ETA
    assert "shard-000000" not in text
    assert p.samples == 4 and p.bytes == 4000 and "4 samples" in p.summary()


def test_logs_get_one_line_per_shard_and_quiet_gets_none() -> None:
    stream = io.StringIO()
    p = Progress(total_samples=10, total_bytes=10_000, what="write", quiet=False, stream=stream)
    p.log_shard(_shard())
    assert stream.getvalue() == "wrote shards/shard-000000.tar: 3 samples, 2048 bytes\n"
    quiet = io.StringIO()
    p = Progress(total_samples=10, total_bytes=10_000, what="write", quiet=True, stream=quiet)
    p.update(3, 10)
    p.log_shard(_shard())
    p.close()
    assert quiet.getvalue() == ""
