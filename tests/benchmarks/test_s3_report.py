"""bench_s3's report (s3_report.py) from synthetic runs: a table per worker count with every form of
shardify's rows, targets judged in the per-sample form (to_list) and on the first batch against
webdataset's own, the load stated, and the headline still reading the 2-worker table."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks import headline
from benchmarks.s3_report import write_results

INFO = {"64MB": {"num_samples": 1000, "num_bytes": 1e8, "num_shards": 2, "bytes_per_sample": 1e5}}


@pytest.fixture(autouse=True)
def _machine(monkeypatch):
    """A fixed Machine line: describing the real one runs `uname` (a subprocess, slow tier only)."""
    monkeypatch.setattr("benchmarks.s3_report.machine_markdown", lambda: "Machine: AMD EPYC, 2 cores, 24 GiB RAM.")


def _run(rate: float, ttfb: float, forms: tuple[float, float] | None = None) -> dict:
    r = {"first_epoch_samples_per_s": rate / 2, "samples_per_s": rate, "mb_per_s": rate / 10, "ttfb_s": ttfb,
         "peak_pss_mib": 500.0, "load": 0.5, "first_epoch_samples_per_cpu_s": rate / 2, "samples_per_cpu_s": rate}
    if forms:
        r |= {"samples_per_s views": forms[0], "samples_per_s to_list": forms[1]}
    return r


def _write(tmp_path: Path, load: float) -> str:
    runs = {"ceiling/64MB": [{"samples_per_s": 20000.0, "bytes_per_s": 2e9, "load": 0.5}],
            "curl1/64MB": [{"samples_per_s": 5000.0, "bytes_per_s": 5e8, "load": 0.5, "cpu_s_per_gb": 0.9}],
            # 2 workers: packed 9000 and views 8500 pass 2x webdataset (8000), to_list 6000 does not
            "shardify/64MB/2": [_run(9000, 0.4, (8500, 6000))], "webdataset/64MB/2": [_run(4000, 0.9)],
            "obstore/64MB/2": [_run(3000, 1.5)],  # a peer below webdataset: the best peer is still webdataset
            "shardify/64MB/0": [_run(7000, 0.5, (7000, 5000))], "webdataset/64MB/0": [_run(2000, 0.3)],
            "obstore/64MB/0": [_run(2400, 0.2)]}  # the best peer without workers
    counts = {f"64MB/{w}": {"before_first_batch": 9, "epoch": 40, "kinds": {"manifest": 1, "index": 2, "listing": 0,
                                                                           "head": 0, "shard and checksum reads": 6}}
              for w in (0, 2)}
    args = argparse.Namespace(num_images=1000, repeats=1, epochs=2, workers=(0, 2), batch_size=256,
                              ceiling_threads=8)
    path = tmp_path / "results_s3.md"
    write_results(path, runs, counts, INFO, args, (load, 1.0, 1.0), "2.13.0")
    return path.read_text()


def _target(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {start}"))


def test_targets_are_judged_per_sample_and_on_webdatasets_first_batch(tmp_path):
    text = _write(tmp_path, load=0.4)
    assert _target(text, "RAW, 2 workers, 64MB shards, per sample").endswith("| NO |")  # to_list 6000 < 8000
    assert "vs webdataset 4000: 1.50x (views 8500, 2.12x)" in _target(text, "RAW, 2 workers, 64MB shards, per sample")
    assert _target(text, "RAW, 0 workers, 64MB shards, per sample").endswith("| yes |")  # 5000 >= 2 x obstore 2400
    assert "vs obstore 2400" in _target(text, "RAW, 0 workers, 64MB shards, per sample")
    # one epoch: 4500 of the highest ceiling (20000, the threads' row, not curl's 5000)
    assert "4500 = 0.23 of 20000" in _target(text, "RAW, 2 workers, 64MB shards, one epoch with start-up")
    assert _target(text, "RAW, 2 workers, 64MB shards, one epoch with start-up").endswith("| NO |")
    assert _target(text, "RAW, 2 workers, 64MB shards, one epoch: >= 2x").endswith("| yes |")  # 4500 vs 2000
    assert _target(text, "first batch, 2 workers").endswith("| yes |")  # 0.4 <= 0.9, no allowance
    assert _target(text, "first batch, 0 workers").endswith("| NO |")  # 0.5 > 0.3
    # CPU: 4500 samples per CPU-second in epoch 1 = 0.222 CPU-s per 1,000 samples = 2.22 CPU-s/GB (100 KB)
    assert "| 0.222 (2.22 CPU-s/GB) | NO |" in _target(text, "CPU, 2 workers, 64MB shards")
    assert "| shardify RAW, 2 workers | 4500 | 9000 | 8500 | 6000 |" in text
    assert "| webdataset RAW, 0 workers | 1000 | 2000 | - | - |" in text
    assert "| obstore RAW, 2 workers | 1500 | 3000 | - | - |" in text
    assert "curl, 1 process, whole shards) | - | 5000 | - | - | 500 | - | - | 0.90 |" in text
    assert "later 9000; to_list 6000 |" in text  # each run's judged rate beside the packed one
    assert "a quiet machine" in text and "start-up requests before the first batch, 64MB shards" in text


def test_a_loaded_machine_is_said_and_the_headline_reads_each_worker_table(tmp_path):
    text = _write(tmp_path, load=3.5)
    assert "**not a quiet machine**" in text
    rows = {h.task: h for h in headline.HEADLINES["s3"](tmp_path / "results_s3.md")}
    two = next(h for task, h in rows.items() if task.endswith(", 2 workers"))
    assert (two.ours, two.peer_value) == (9000, 4000)  # the 2-worker rows
    assert two.per_sample == (8500, 6000)  # views, to_list: the per-sample forms beside the packed rate
    none = next(h for task, h in rows.items() if task.endswith(", no workers"))
    assert (none.peer, none.peer_value) == ("obstore", 2400)  # the best 0-worker peer, not a 2-worker row
    assert two.peer == "webdataset"  # best at 2 workers; never a ceiling row (20000)
    assert two.load.startswith("3.5")


def test_the_servers_cpu_is_a_column_and_bounds_the_ceiling_target(tmp_path, monkeypatch):
    """Rows measured with the server's CPU show it; the ceiling target states what the cores allow each side
    (cores / (server + client CPU-s per GB)) so a distance to the ceiling reads as CPU or as waiting."""
    monkeypatch.setattr("benchmarks.s3_report.os.cpu_count", lambda: 2)
    ours = _run(9000, 0.4, (8500, 6000)) | {"server_cpu_s_per_gb": 2.0}  # epoch 1: 4500 per CPU-s = 2.22 CPU-s/GB
    runs = {"curl2/64MB": [{"samples_per_s": 8000.0, "bytes_per_s": 8e8, "load": 0.5, "cpu_s_per_gb": 0.5,
                            "server_cpu_s_per_gb": 1.5}],
            "shardify/64MB/2": [ours], "webdataset/64MB/2": [_run(4000, 0.9)]}
    counts = {"64MB/2": {"before_first_batch": 9, "epoch": 40, "kinds": {"manifest": 1, "index": 2, "listing": 0,
                                                                        "head": 0, "shard and checksum reads": 6}}}
    args = argparse.Namespace(num_images=1000, repeats=1, epochs=2, workers=(2,), batch_size=256, ceiling_threads=8)
    path = tmp_path / "results_s3.md"
    write_results(path, runs, counts, INFO, args, (0.4, 1.0, 1.0), "2.13.0")
    text = path.read_text()
    assert "| server CPU-s/GB |" in text.splitlines()[text.splitlines().index("### 2 workers") + 2]
    assert "curl, 2 processes, whole shards) | - | 8000 | - | - | 800 | - | - | 0.50 | - | 1.50 |" in text
    assert "| 2.22 | 1.11 | 0.222 | 2.00 |" in _row(text, "shardify RAW, 2 workers")  # its CPU, then the server's
    # 2 cores / (2.0 + 2.22 CPU-s/GB) = 0.474 GB/s = 4737 samples of 100 KB; curl: 2 / (1.5 + 0.5) = 10000
    target = _target(text, "RAW, 2 workers, 64MB shards, one epoch with start-up")
    assert "server 2.00 + shardify 2.22 CPU-s/GB allow 4737/s" in target
    assert "server 1.50 + curl 0.50 allow 10000/s: the bound's ratio 0.47" in target
    assert "| 0.500 | - | 500 |" in _row(text, "webdataset RAW, 2 workers")  # no server figure measured


def _row(text: str, what: str) -> str:
    return next(line for line in text.splitlines() if f"| {what} |" in line)


def test_worker_processes_are_a_row_of_their_own_and_judged_per_sample(tmp_path):
    """shardify with worker_mode="processes" (the peers' own form: DataLoader worker processes, one bytes
    object per sample) is a row beside the default one and judged against the best peer, one epoch and
    to_list; the headline still reads the default row."""
    runs = {"curl2/64MB": [{"samples_per_s": 8000.0, "bytes_per_s": 8e8, "load": 0.5, "cpu_s_per_gb": 0.5}],
            "shardify/64MB/2": [_run(9000, 0.4, (8500, 6000))],
            "shardify-processes/64MB/2": [_run(7000, 0.6, (6500, 5000))],  # one epoch 3500, to_list 5000
            "webdataset/64MB/2": [_run(2400, 0.9)]}  # one epoch 1200, later 2400
    args = argparse.Namespace(num_images=1000, repeats=1, epochs=2, workers=(2,), batch_size=256, ceiling_threads=8)
    path = tmp_path / "results_s3.md"
    write_results(path, runs, {}, INFO, args, (0.4, 1.0, 1.0), "2.13.0")
    text = path.read_text()
    assert "| 64MB | shardify RAW, 2 worker processes | 3500 | 7000 | 6500 | 5000 |" in text
    lines = text.splitlines()
    assert lines.index(_row(text, "shardify RAW, 2 workers")) + 1 == lines.index(
        _row(text, "shardify RAW, 2 worker processes"))  # right after the default row, before the peers
    target = _target(text, "RAW, 2 worker processes, 64MB shards")
    assert "one epoch 3500 vs webdataset 1200: 2.92x; to_list 5000 vs webdataset 2400: 2.08x | yes |" in target
    rows = {h.task: h for h in headline.HEADLINES["s3"](path)}
    two = next(h for task, h in rows.items() if task.endswith(", 2 workers"))
    assert two.ours == 9000 and two.peer == "webdataset"
