"""The verdict advises --decode dali only where it can help: with a GPU, or where DALI's CPU decode measured faster."""

from __future__ import annotations

import pytest
import torch

from trainer.report import combine, summarize, verdict
from trainer.timing import StepRecord


def _decode_bound() -> dict:
    """A rank that waits 75% of each step for data, loading being mostly decode (read 0.05 of 0.35 s)."""
    rec = StepRecord(step=1, epoch=0, start_s=0.0, step_s=0.4, wait_s=0.3, h2d_s=0.0, compute_s=0.1,
                     comm_exposed_s=0.0, comm_overlapped_s=0.0, opt_s=0.0, samples=8, read_s=0.05, decode_s=0.3)
    return combine([summarize([rec], rank=0)], num_workers=2, decode="cpu")


def test_without_a_gpu_dali_is_not_advised_and_the_tip_names_the_measurement():
    text = verdict(_decode_bound(), num_workers=2, decode="cpu", has_gpu=False)
    assert text.startswith("INPUT-BOUND") and "try --decode dali" not in text
    assert "decode is 86% of the measured loading work" in text and "--num-workers (now 2)" in text
    assert "not advised without a GPU" in text and "not measured faster" in text
    slower = verdict(_decode_bound(), num_workers=2, decode="cpu", has_gpu=False, dali_cpu_speedup=0.59)
    assert "try --decode dali" not in slower and "measured 0.59x --decode cpu" in slower


def test_gpu_decode_is_advised_with_a_gpu_and_dali_where_its_cpu_path_measured_faster():
    assert "try --decode auto (the GPU decodes beside the CPU workers" in verdict(
        _decode_bound(), num_workers=2, decode="cpu", has_gpu=True)
    old_loader = verdict(_decode_bound(), num_workers=2, decode="cpu", has_gpu=True, offered=("cpu", "dali", None))
    assert "try --decode dali (GPU decode)" in old_loader  # a loader without the GPU decoder: DALI
    faster = verdict(_decode_bound(), num_workers=2, decode="cpu", has_gpu=False, dali_cpu_speedup=1.4)
    assert "try --decode dali (its CPU decode measured 1.40x --decode cpu on this machine)" in faster


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the default on a machine without a GPU")
def test_the_trainers_default_asks_torch_for_a_gpu():
    assert "try --decode dali" not in _decode_bound()["verdict"]


def test_with_a_gpu_but_no_dali_the_tip_says_how_to_install_it(monkeypatch):
    """The first lent GPU machine had no DALI: advising --decode dali there must say what to install."""
    import trainer.report as report

    monkeypatch.setattr(report, "_dali_installed", lambda: False)
    text = verdict(_decode_bound(), num_workers=2, decode="cpu", has_gpu=True, offered=("cpu", "dali", None))
    assert "try --decode dali (GPU decode) after `pip install 'shardify[dali]'` (DALI is not installed here)" in text
    monkeypatch.setattr(report, "_dali_installed", lambda: True)
    assert "not installed" not in verdict(_decode_bound(), num_workers=2, decode="cpu", has_gpu=True,
                                          offered=("cpu", "dali", None))
