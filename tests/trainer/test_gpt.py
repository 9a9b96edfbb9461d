"""--model gpt: document masking keeps attention inside documents, FLOPs and MFU arithmetic, the next-token
targets; what a 2-rank run on token shards must report and validate (every held-out token once; its torchrun
run is test_which_tokens_run.py's), and a tokenizer of another hash refused before training."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dataio.storage.store import Store
from tests.dataio.tokengen import write_token_dataset
from tests.trainer.harness import ok, run_here, summary
from trainer.gpt import GPT, document_mask, peak_flops, to_device

TINY = dict(vocab_size=50, seq_len=12, n_layer=2, n_embd=16, n_head=2)


def test_document_masking_keeps_attention_inside_each_document() -> None:
    torch.manual_seed(0)
    model = GPT(**TINY).eval()
    doc = torch.tensor([[3, 3, 3, 3, 8, 8, 8, 8, 8, 8]])
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]])
    a = torch.randint(1, 50, (1, 10))
    b = a.clone()
    b[0, :4] = (a[0, :4] + 7) % 50  # another first document
    with torch.no_grad():
        out_a, out_b = model(a, pos, doc), model(b, pos, doc)
        plain_a, plain_b = model(a), model(b)
    torch.testing.assert_close(out_a[0, 4:], out_b[0, 4:])  # the second document never sees the first
    assert not torch.allclose(plain_a[0, 4:], plain_b[0, 4:])  # without doc_ids it does (plain causal)
    mask = document_mask(doc)[0, 0]
    assert mask[5, 4] and not mask[4, 3] and not mask[4, 5]


def test_flops_per_token_and_peak() -> None:
    model = GPT(**TINY)
    n = sum(p.numel() for p in model.parameters()) - 12 * 16
    assert model.flops_per_token() == 6 * n + 12 * 2 * 16 * 12
    assert peak_flops(SimpleNamespace(peak_flops=1e12), torch.device("cpu")) == 1e12
    assert peak_flops(SimpleNamespace(peak_flops=0.0), torch.device("cpu")) == 0.0  # no MFU on CPU


def test_targets_skip_padding_and_repeats() -> None:
    ids = torch.tensor([[5, 6, 7, 0, 0], [1, 2, 3, 4, 9]])
    keep = torch.tensor([[True, True, True, False, False], [True] * 5])
    batch = {"input_ids": ids, "loss_mask": keep, "mask": torch.tensor([True, False]),
             "position_ids": torch.zeros_like(ids), "doc_ids": torch.zeros_like(ids)}
    inputs, targets, pos, doc = to_device(batch, torch.device("cpu"))
    assert inputs.tolist() == [[5, 6, 7, 0], [1, 2, 3, 4]]
    assert targets.tolist() == [[6, 7, -1, -1], [-1, -1, -1, -1]]  # a repeat (mask False) teaches nothing
    assert pos.shape == doc.shape == (2, 4)
    assert to_device(batch, torch.device("cpu"), doc_masking=False)[3] is None


DOCS = [[30, 4, 61], [17, 90, 2, 2], [45], [70, 12, 9]]
VAL = [[20, 33], [5, 41, 3]]


def reports_tokens_and_validates_every_token_once(stdout: str, out: Path) -> None:
    """What a 2-rank --model gpt run with --val-data VAL, --peak-flops and --price-per-hour must show. Its
    torchrun run is test_which_tokens_run.py's first (one job for both)."""
    assert "tokens/s per rank" in stdout and "MFU" in stdout
    # a token run's reports count tokens: the live rows, the summary's global line, the cost per million tokens
    assert "tokens/s=" in stdout and "sequences/s of 16 tokens" in stdout
    assert "per million tokens" in stdout and "samples/s" not in stdout
    rep = summary(out)
    assert rep["world_size"] == 2
    # concat packing, tail padded and masked: every token of the held-out set is a label once but the first
    assert rep["validation"]["samples"] == sum(map(sum, VAL)) - 1
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    tokens = [r for r in records if r["kind"] == "tokens"]
    assert tokens and tokens[0]["mfu"] > 0 and tokens[0]["flops_per_token"] > 0
    assert rep["cost"]["dollars_per_1m_tokens"] > 0 and rep["tokens_per_s"] == rep["samples_per_s"] * 16


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_tokenizer_of_another_hash_is_refused_before_training(tmp_path, capsys) -> None:
    write_token_dataset(Store(str(tmp_path / "train")), DOCS)
    (tmp_path / "tok.json").write_text("{}")
    result = run_here(["--model", "gpt", "--data", str(tmp_path / "train"), "--tokenizer",
                       str(tmp_path / "tok.json"), "--out", str(tmp_path / "out")], capsys)
    assert result.returncode != 0
    output = result.stderr + result.stdout
    assert "tokenized by 'ids'" in output and "pass the dataset's tokenizer" in output


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_token_mixture_follows_its_weight_schedule(tmp_path, capsys) -> None:
    write_token_dataset(Store(str(tmp_path / "a")), DOCS * 4)
    write_token_dataset(Store(str(tmp_path / "b")), DOCS * 4)  # the same vocabulary: one tokenizer
    out = tmp_path / "out"
    ok(run_here([
        "--model", "gpt", "--data", str(tmp_path / "a"), "--data", str(tmp_path / "b"),
        "--mix-schedule", "1,0@24; 0,1", "--seq-len", "8", "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
        "--batch-size", "4", "--num-workers", "1", "--log-every", "3", "--max-steps", "12", "--out", str(out),
        "--resume", "none"], capsys))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    shares = [[s["observed"] for s in r["sources"]] for r in rows if r["kind"] == "train"]
    # one process, 4 sequences a step: the first 24 sequences (6 steps) all from a, then all from b
    assert shares[0] == [1.0, 0.0] and shares[-1] == [0.0, 1.0]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_scaling_study_of_a_gpt_reports_tokens_and_cost_per_million_tokens(tmp_path, capsys, monkeypatch) -> None:
    from tests.trainer.harness import run_study

    write_token_dataset(Store(str(tmp_path / "train")), DOCS * 8)
    out = tmp_path / "scaling"
    argv = ["--nproc", "1", "--steps", "4", "--out", str(out),
           "--link-gbps", "10", "--link-latency-us", "50", "--price-per-hour", "2", "--input-batches", "5", "--",
           "--model", "gpt", "--data", str(tmp_path / "train"), "--seq-len", "8", "--n-layer", "1", "--n-embd", "16",
           "--n-head", "2", "--batch-size", "2", "--dist-timeout-s", "60"]
    code, said = run_study(argv, {}, capsys, monkeypatch)  # the study in this interpreter, its torchrun job not
    assert code == 0, said[-6000:]
    assert "tokens/s" in said and "$/1M tok" in said and "model check, tokens/s" in said
    variant = json.loads((out / "scaling.json").read_text())["variants"][0]
    assert variant["tokens_per_sample"] == 8
    row = variant["measured"][0]
    assert row["tokens_per_s"] == pytest.approx(row["samples_per_s"] * 8)
    assert row["cost"]["dollars_per_1m_tokens"] == pytest.approx(1e6 * 2 / 3600 / row["tokens_per_s"])
