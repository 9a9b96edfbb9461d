"""`--model clip`: a small CLIP trained on image-text pair batches (make_loader(tokenizer=, context_length=)).

The image tower is the project's compact ResNet (trainer/models.py) with its head as the
projection; the text tower is the GPT's pre-norm blocks (trainer/gpt.py) under a causal mask that
also hides padding, pooled at each caption's end token. The loss is the symmetric contrastive loss
with a learned temperature, clamped at 100 as CLIP does. Under DDP every rank gathers the others'
features (all_gather), keeps its own slice as the live tensor so gradients reach its tower, and
computes the loss over the whole global batch: the negatives grow with the world size, and the
loss is the single-process loss of the global batch, on every rank (open_clip's gather without
gradients through the other ranks, local_loss=False). Validation is zero-shot: class names turned
into caption prompts, each image given the class whose prompt is most similar.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from dataio.loader.protocol import TrainLoader
from trainer import runtime
from trainer.gpt import Block

CLIP_MODELS = ("clip", "clip_vit")  # --model names of a CLIP: the ResNet image tower, or a ViT (trainer/models.py)
MAX_LOGIT_SCALE = 100.0  # CLIP clamps exp(logit_scale) here: a sharper softmax destabilises training
PROMPT = "a photo of a {}"


class TextTower(nn.Module):
    """Token + position embeddings, GPT blocks, a final norm; the feature of each caption at its end token."""

    def __init__(self, *, vocab_size: int, context_length: int, width: int, layers: int, heads: int,
                 embed_dim: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab_size, width), nn.Embedding(context_length, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.proj = nn.Linear(width, embed_dim, bias=False)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.01)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # ids, mask: [B, T] int64 -> features [B, embed_dim]
        T = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(T, device=ids.device))
        causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        # [B, 1, T, T]: causal, and no attention to padding keys (a real query always sees key 0)
        attn = causal[None, None] & mask.bool()[:, None, None, :]
        for block in self.blocks:
            x = block(x, attn)
        last = (mask.sum(1) - 1).clamp(min=0)  # each caption's end token
        return self.proj(self.ln(x[torch.arange(len(ids), device=ids.device), last]))


class CLIP(nn.Module):
    """Image and text towers projecting to one embedding space, and the learned logit scale."""

    def __init__(self, *, visual: nn.Module, vocab_size: int, context_length: int, embed_dim: int = 64,
                 width: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.visual = visual  # images [B, 3, H, W] -> [B, embed_dim]: the registry's ResNet (models.clip)
        self.text = TextTower(vocab_size=vocab_size, context_length=context_length, width=width, layers=layers,
                              heads=heads, embed_dim=embed_dim)
        self.context_length = context_length
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.visual(images), dim=-1)

    def encode_text(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.text(ids, mask), dim=-1)

    def scale(self) -> torch.Tensor:
        """exp(logit_scale), clamped at MAX_LOGIT_SCALE (the gradient stops there, as in CLIP)."""
        return self.logit_scale.exp().clamp(max=MAX_LOGIT_SCALE)

    def forward(self, images: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.encode_image(images), self.encode_text(ids, mask), self.scale()


def gather_features(local: torch.Tensor, *, rank: int, world_size: int) -> torch.Tensor:
    """[world_size * B, D]: every rank's features in rank order, this rank's slice the live `local`
    (gradients reach this rank's tower), the others' received without gradient. Equal B on every
    rank: the loader's equal steps and whole batches."""
    if world_size == 1:
        return local
    received = [torch.empty_like(local) for _ in range(world_size)]
    torch.distributed.all_gather(received, local.detach().contiguous())
    received[rank] = local
    return torch.cat(received)


def contrastive_loss(image: torch.Tensor, text: torch.Tensor, scale: torch.Tensor, *, rank: int = 0,
                     world_size: int = 1) -> torch.Tensor:
    """The symmetric InfoNCE loss over the global batch (pair i of the gathered batch is the positive
    of row i), the same value on every rank; image, text: [B, D] normalised, this rank's pairs."""
    all_image = gather_features(image, rank=rank, world_size=world_size)
    all_text = gather_features(text, rank=rank, world_size=world_size)
    logits = scale * all_image @ all_text.T  # [N, N], N = world_size * B
    labels = torch.arange(len(logits), device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def to_device(batch: dict[str, Any], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(images float [B, 3, H, W] in [0, 1], input_ids, attention_mask) on the device."""
    nb = device.type == "cuda"
    images = batch["image"].to(device, non_blocking=nb).float().div_(255)
    return images, batch["input_ids"].to(device, non_blocking=nb), batch["attention_mask"].to(device, non_blocking=nb)


def micro_step(run: Any, batch: dict[str, Any], last: bool) -> tuple[float, int]:
    """One pair micro-batch: copy, forward, gathered loss, backward (DDP syncs on the last).

    Every rank's loss is the whole global batch's, so its gradient already sums the ranks' shares;
    DDP averages over world_size ranks, hence the loss is scaled by world_size (the gradient is the
    single-process one of the global batch)."""
    cfg, rt, timer = run.cfg, run.rt, run.timer
    with timer.phase("h2d"):
        images, ids, mask = to_device(batch, rt.device)
    sync = run.net.no_sync() if (rt.distributed and not last) else contextlib.nullcontext()
    with timer.phase("fwd_bwd"), sync:
        loss = ddp_loss(run.net, images, ids, mask, rank=rt.rank, world_size=rt.world_size)
        run.scaler.scale(loss / cfg.grad_accum).backward()  # as .backward() unless --precision fp16
    return float(loss.detach()) / rt.world_size / cfg.grad_accum, int(batch["mask"].sum())


def ddp_loss(net: nn.Module, images: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, *, rank: int,
             world_size: int) -> torch.Tensor:
    """world_size x the global batch's loss, arranged so that DDP's average of the ranks' gradients is
    the single-process gradient of the global batch: a rank's features get the whole loss's gradient
    (its slice of every row and column), the scale, which every rank holds whole, 1/world_size of it."""
    image, text, scale = net(images, ids, mask)
    share = scale / world_size + scale.detach() * (1 - 1 / world_size)  # the same value, 1/W of the gradient
    return contrastive_loss(image, text, share, rank=rank, world_size=world_size) * world_size


def prompt_ids(class_names: Sequence[str], tokenizer: str, context_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [C, context_length] of "a photo of a NAME" for each class, tokenized
    as the loader tokenizes captions."""
    from dataio.stream.captions import CaptionStage

    stage = CaptionStage(tokenizer=tokenizer, context_length=context_length, seed=0)
    out = stage.tokenize([PROMPT.format(name.replace("_", " ")) for name in class_names])
    return out["input_ids"], out["attention_mask"]


def tokenizer_of(cfg: Any, loader: Any) -> str:
    """The captions' tokenizer file: --tokenizer, else the one the pair dataset's manifest names (as the
    loader resolved it); ValueError without either."""
    if cfg.tokenizer:
        return cfg.tokenizer
    stage = getattr(getattr(loader, "job", None), "captions", None)  # a ShardLoader's caption stage
    if stage is None:
        raise ValueError("--model clip tokenizes captions: give --tokenizer FILE (a tokenizer.json or .tiktoken; "
                         "make one with `shardify tokenizer train`), or train on a pair dataset written with "
                         "--captions --tokenizer FILE")
    return str(stage.tokenizer)


def vocab_size_of(cfg: Any, loader: Any = None) -> int:
    """The text tower's vocabulary: the captions' tokenizer's (tokenizer_of)."""
    from dataio.stream.captions import load_caption_tokenizer

    return load_caption_tokenizer(tokenizer_of(cfg, loader)).vocab_size


@torch.no_grad()
def zero_shot(model: CLIP, loader: TrainLoader, rt: runtime.Runtime, *, tokenizer: str, epoch: int,
              class_names: Sequence[str] | None = None) -> dict[str, float]:
    """Zero-shot accuracy (and the contrastive loss of image against class prompt) over a held-out
    labelled image set, every sample once, padding masked; class names: the set's label names. The
    same numbers on every rank."""
    names = class_names or loader.label_names
    if not names:
        raise ValueError("--model clip validates zero-shot: --val-data must be a labelled image set whose "
                         "manifest names its classes (shardify write of class folders, or --label-names)")
    was_training = model.training
    model.eval()
    loader.set_epoch(epoch)
    correct, count, loss_sum = 0.0, 0.0, 0.0
    try:
        ids, mask = prompt_ids(names, tokenizer, model.context_length)
        classes = model.encode_text(ids.to(rt.device), mask.to(rt.device))  # [C, D]
        for batch in loader:
            images = batch["image"].to(rt.device).float().div_(255)
            logits = (model.scale() * model.encode_image(images) @ classes.T).float().cpu()  # [B, C]
            labels = batch["label"]
            keep = batch["mask"] & (labels >= 0)
            loss_sum += float(F.cross_entropy(logits, labels.clamp(min=0), reduction="none")[keep].sum())
            correct += float((logits.argmax(1) == labels)[keep].sum())
            count += float(keep.sum())
    finally:
        model.train(was_training)
    correct, count, loss_sum = runtime.all_sum(rt, [correct, count, loss_sum])
    return {"loss": loss_sum / max(count, 1.0), "accuracy": correct / max(count, 1.0),
            "chance": 1.0 / len(names), "samples": int(count)}
