"""benchmarks.gpu_check: the dry run does every step on CPU twins; without a GPU the real run refuses."""

from __future__ import annotations

import pytest
import torch

from benchmarks import gpu_check


@pytest.mark.slow  # starts pytest, the shardify CLI and torchrun
def test_dry_run_runs_every_step_on_cpu_twins(tmp_path):
    results = tmp_path / "results_gpu.md"
    assert gpu_check.main(["--dry-run", "--results", str(results)]) == 0
    text = results.read_text()
    assert text.startswith("# GPU check (DRY RUN")
    for section in ("## Environment", "## GPU-only tests", "## Decode", "## The race", "## Training"):
        assert section in text
    assert "Failed" not in text and "failed:" not in text and "images per CPU-second" in text and "verdict:" in text
    assert "decode + RRC crop + resize 224" in text and "skipped" in text
    assert "the loader's GPU decoder, CPU twin" in text  # decode="gpu"'s own decoder, on its CPU twin
    for row in ("the ceiling", "ImageFolder", 'make_loader(decode="cpu")', 'make_loader(decode="gpu")',
                'make_loader(decode="auto")', "the torchrun trainer"):
        assert row in text
    assert "gpu_share" in text and "no figure here says anything about a GPU" in text


def test_trainer_flags_take_what_the_trainer_has() -> None:
    help_text = "  --decode DECODE       image decode: one of ('cpu', 'dali', 'gpu', 'auto')\n  --channels-last  x\n"
    flags, missing = gpu_check.trainer_flags(help_text, dry_run=False)
    assert flags == ["--decode", "auto", "--channels-last"]
    assert missing == ["--precision bf16", "--model resnet50"]
    flags, missing = gpu_check.trainer_flags("  --decode DECODE  one of ('cpu', 'dali')\n  --seed SEED\n", dry_run=True)
    assert flags == [] and missing == ["--decode auto", "--precision bf16", "--channels-last"]


def test_without_a_gpu_it_exits_non_zero_with_a_clear_message(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--results", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "--dry-run" in err
    assert not (tmp_path / "r.md").exists()
