"""`--model gpt`: a small decoder-only transformer trained on token batches (make_loader with seq_len: the token stream, dataio/stream/token_stream.py).

Attention is torch.nn.functional.scaled_dot_product_attention: causal, and with document masking
(block-diagonal causal: a token attends only to earlier tokens of its own document) when the batch
carries doc_ids; positions come from the batch's position_ids (0 at each document start). The loss
is next-token cross-entropy over the pairs whose input and label are both real tokens (loss_mask).
Also here: FLOPs per token (6N + attention, as PaLM and nanoGPT count them), the MFU estimate, and
validation over a held-out token dataset, every token once (its loader pads the tail, masked).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from dataio.loader.protocol import TrainLoader
from trainer import nonfinite, runtime
from trainer.accel import Accel

# Dense bf16 peak FLOP/s per accelerator, by a substring of torch.cuda.get_device_name().
PEAK_FLOPS = (("H200", 989e12), ("H100", 989e12), ("A100", 312e12), ("L4", 121e12))


class Block(nn.Module):
    """Pre-norm transformer block: attention (SDPA) then a 4x GELU MLP, each with a residual."""

    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv, self.proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        # [B, T, C] -> [B, n_head, T, C / n_head]
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, n_layer blocks, a final norm, the head tied to the token embedding."""

    def __init__(self, *, vocab_size: int, seq_len: int, n_layer: int, n_embd: int, n_head: int) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"--n-embd {n_embd} must be a multiple of --n-head {n_head}")
        self.seq_len, self.n_layer, self.n_embd = seq_len, n_layer, n_embd
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(seq_len, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, pos: torch.Tensor | None = None,
                doc: torch.Tensor | None = None) -> torch.Tensor:
        # idx, pos, doc: [B, T] int64 -> logits [B, T, vocab]
        T = idx.shape[1]
        if pos is None:
            pos = torch.arange(T, device=idx.device).expand_as(idx)
        x = self.wte(idx) + self.wpe(pos.clamp(max=self.seq_len - 1))
        mask = document_mask(doc) if doc is not None else None
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))

    def flops_per_token(self) -> float:
        """6 N (N: parameters but the position embedding) + 12 n_layer n_embd seq_len (attention)."""
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        return 6.0 * n + 12.0 * self.n_layer * self.n_embd * self.seq_len


def document_mask(doc: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] bool, True where query i may attend key j: j <= i and the same document (block-diagonal causal)."""
    T = doc.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc.device).tril()
    return (doc[:, :, None] == doc[:, None, :]).logical_and_(causal)[:, None]


def gpt(*, num_classes: int, image_size: int, in_features: int = 0, seq_len: int = 256, n_layer: int = 4,
        n_embd: int = 128, n_head: int = 4) -> nn.Module:
    """The registry's factory: num_classes is the tokenizer's vocabulary size."""
    if in_features:
        raise ValueError("model 'gpt' takes token datasets (--seq-len), not --features rows")
    return GPT(vocab_size=num_classes, seq_len=seq_len, n_layer=n_layer, n_embd=n_embd, n_head=n_head)


def model_sizes(cfg: Any) -> dict[str, int]:
    """gpt's size flags, for build_model."""
    return {"seq_len": cfg.seq_len, "n_layer": cfg.n_layer, "n_embd": cfg.n_embd, "n_head": cfg.n_head}


def vocab_size_of(loader: TrainLoader) -> int:
    """The dataset's tokenizer vocabulary (the model's output size); ValueError for data without tokens."""
    if not loader.facts.sources or "input_ids" not in loader.facts.sources[0].field_names:
        raise ValueError("--model gpt trains on a token dataset (`shardify write TEXT DEST --tokenizer FILE`); "
                         "this --data holds no tokens")
    return int(loader.num_classes)


def to_device(batch: dict[str, Any], device: torch.device, *, doc_masking: bool = True
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(inputs [B, L], targets [B, L] with -1 where no loss, positions or None, documents or None)."""
    nb = device.type == "cuda"
    ids, keep = batch["input_ids"].to(device, non_blocking=nb), batch["loss_mask"].to(device, non_blocking=nb)
    keep = keep & batch["mask"].to(device, non_blocking=nb)[:, None]
    targets = ids[:, 1:].masked_fill(~(keep[:, 1:] & keep[:, :-1]), -1)
    pos = batch["position_ids"].to(device, non_blocking=nb)[:, :-1] if "position_ids" in batch else None
    doc = batch["doc_ids"].to(device, non_blocking=nb)[:, :-1] if doc_masking and "doc_ids" in batch else None
    return ids[:, :-1], targets, pos, doc


def token_loss(net: nn.Module, accel: Accel, inputs: torch.Tensor, targets: torch.Tensor,
               pos: torch.Tensor | None, doc: torch.Tensor | None) -> torch.Tensor:
    """Mean next-token cross-entropy over the real pairs (targets -1 elsewhere), forward under `accel`'s autocast."""
    with accel.autocast():
        logits = net(inputs, pos, doc)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1)


def micro_step(run: Any, batch: dict[str, Any], last: bool) -> tuple[float, int]:
    """One token micro-batch: copy, forward, backward (DDP syncs on the last); (its loss share, real sequences)."""
    cfg, rt, timer = run.cfg, run.rt, run.timer
    with timer.phase("h2d"):
        tensors = to_device(batch, rt.device, doc_masking=cfg.doc_masking)
    if "source" in batch:  # a mixture: real sequences per source, for the report
        run.recorder.count_sources(batch["source"], batch["mask"])
    sync = run.net.no_sync() if (rt.distributed and not last) else contextlib.nullcontext()
    with timer.phase("fwd_bwd"), sync:
        loss = token_loss(run.net, run.accel, *tensors) / cfg.grad_accum
        run.scaler.scale(nonfinite.carried(loss)).backward()  # NaN gradients on every rank when this loss is not finite
    return float(loss.detach()), int(batch["mask"].sum())


@torch.no_grad()
def evaluate(model: nn.Module, loader: TrainLoader, rt: runtime.Runtime, *, epoch: int, accel: Accel,
             doc_masking: bool = True) -> dict[str, float]:
    """Next-token loss and accuracy over the whole held-out dataset, every token once; the same on every rank."""
    was_training = model.training
    model.eval()
    loader.set_epoch(epoch)
    loss_sum, correct, count = 0.0, 0.0, 0.0
    try:
        for batch in loader:
            inputs, targets, pos, doc = to_device(batch, rt.device, doc_masking=doc_masking)
            with accel.autocast():
                logits = model(inputs, pos, doc).float()
            keep = targets >= 0
            loss_sum += float(F.cross_entropy(logits[keep], targets[keep], reduction="sum"))
            correct += float((logits.argmax(-1) == targets)[keep].sum())
            count += float(keep.sum())
    finally:
        model.train(was_training)
    loss_sum, correct, count = runtime.all_sum(rt, [loss_sum, correct, count])
    return {"loss": loss_sum / max(count, 1.0), "accuracy": correct / max(count, 1.0), "samples": int(count)}


def row_keys(batch: dict[str, Any]) -> list[str]:
    """--record-keys for token batches: per real row, its documents (global numbers in their dataset, the
    batch's doc_ids) in order, 'd12+d13'; what `shardify which` names by document and token range."""
    if "doc_ids" not in batch:
        return []
    keep, docs = batch["mask"].tolist(), batch["doc_ids"].numpy()
    out = []
    for row, real in zip(docs, keep):
        if real:
            runs = row[np.r_[True, row[1:] != row[:-1]]]  # (k,) each run of one document, in order
            out.append("+".join(f"d{d}" for d in runs[runs >= 0].tolist()))
    return out


def peak_flops(cfg: Any, device: torch.device) -> float:
    """--peak-flops, else the table's dense bf16 peak of the GPU in use; 0.0 when unknown (CPU)."""
    if cfg.peak_flops:
        return float(cfg.peak_flops)
    if device.type != "cuda":
        return 0.0
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_FLOPS if key in name), 0.0)


def token_report(run: Any, rep: dict[str, Any] | None) -> None:
    """Rank 0: tokens/s per rank and the MFU estimate, as a metrics line and a note."""
    if rep is None or not rep.get("samples_per_s"):
        return
    model, cfg, rt = run.model, run.cfg, run.rt
    per_rank = float(rep["samples_per_s"]) * cfg.seq_len / rt.world_size
    flops = model.flops_per_token()
    peak = peak_flops(cfg, rt.device)
    mfu = per_rank * flops / peak if peak else math.nan
    run.recorder.event({"kind": "tokens", "tokens_per_s_per_rank": per_rank, "flops_per_token": flops,
                        "peak_flops": peak, "mfu": None if math.isnan(mfu) else mfu})
    where = f"MFU {mfu:.1%} of {peak / 1e12:.0f} TFLOP/s" if peak else "MFU n/a (give --peak-flops for this device)"
    run.recorder.note(f"tokens: {per_rank:,.0f} tokens/s per rank ({flops / 1e6:.1f} MFLOP per token); {where}")
