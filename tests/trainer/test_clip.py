"""`--model clip`'s pieces: the contrastive loss under DDP on 2 gloo ranks (mp.spawn) against the
single-process loss and gradients of the same global batch, the clamped logit scale, padding
ignored by the text tower, and zero-shot prompts."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer.clip import CLIP, MAX_LOGIT_SCALE, contrastive_loss, ddp_loss
from trainer.models import SmallResNet

pytestmark = pytest.mark.timeout(180)
B, T, VOCAB = 3, 6, 50  # per rank


def _model() -> CLIP:
    torch.manual_seed(0)
    return CLIP(visual=SmallResNet(16), vocab_size=VOCAB, context_length=T, embed_dim=16, width=16, layers=1,
                heads=2).eval()


def _global_batch(world_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    n = world_size * B
    images = torch.rand(n, 3, 16, 16, generator=g)
    ids = torch.randint(1, VOCAB, (n, T), generator=g)
    lengths = torch.randint(2, T + 1, (n,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    return images, ids * mask, mask


def _reference(world_size: int) -> tuple[float, dict[str, torch.Tensor]]:
    model = _model()
    loss = contrastive_loss(*model(*_global_batch(world_size)))
    loss.backward()
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _rank(rank: int, world_size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size,
                                         timeout=__import__("datetime").timedelta(seconds=60))
    try:
        net = DDP(_model())
        images, ids, mask = (t[rank * B:(rank + 1) * B] for t in _global_batch(world_size))
        loss = ddp_loss(net, images, ids, mask, rank=rank, world_size=world_size)
        loss.backward()  # DDP averages the ranks' gradients
        want_loss, want_grads = _reference(world_size)
        assert abs(float(loss) / world_size - want_loss) < 1e-5, (float(loss) / world_size, want_loss)
        for name, p in net.module.named_parameters():
            if name in want_grads:
                torch.testing.assert_close(p.grad, want_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    finally:
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two spawned processes, each importing torch: seconds
def test_two_ranks_gather_negatives_and_match_the_single_process_loss_and_gradients() -> None:
    # Spawned, not forked: a rank forked from a test process that ran torch.distributed before (and has
    # other tests' threads) can hang in init_process_group (seen: `make test-fast`, 2026-11-29).
    mp.spawn(_rank, args=(2, _free_port()), nprocs=2, join=True)


def test_one_rank_loss_is_the_plain_contrastive_loss() -> None:
    model = _model()
    images, ids, mask = _global_batch(1)
    torch.testing.assert_close(ddp_loss(model, images, ids, mask, rank=0, world_size=1),
                               contrastive_loss(*model(images, ids, mask)))


def test_the_negatives_matter_and_a_matched_batch_scores_low() -> None:
    image = torch.nn.functional.normalize(torch.eye(4, 8), dim=-1)
    matched = contrastive_loss(image, image, torch.tensor(MAX_LOGIT_SCALE))
    shuffled = contrastive_loss(image, image.roll(1, 0), torch.tensor(MAX_LOGIT_SCALE))
    assert float(matched) < 1e-3 < float(shuffled)


def test_logit_scale_is_clamped_and_stops_its_gradient_there() -> None:
    model = _model()
    with torch.no_grad():
        model.logit_scale.fill_(10.0)  # exp(10) > 100
    assert float(model.scale().detach()) == MAX_LOGIT_SCALE
    contrastive_loss(*model(*_global_batch(1))).backward()
    assert float(model.logit_scale.grad) == 0.0


def test_padding_does_not_change_a_caption_feature() -> None:
    model = _model()
    ids = torch.tensor([[5, 6, 7, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0, 0, 0]])
    other = ids.clone()
    other[0, 4] = 9  # a different id where the mask says padding
    torch.testing.assert_close(model.encode_text(ids, mask), model.encode_text(other, mask))
    assert not torch.allclose(model.encode_text(ids, mask), model.encode_text(ids, torch.tensor([[1, 1, 0, 0, 0, 0]])))



def test_the_captions_tokenizer_is_the_flag_or_the_one_the_dataset_names() -> None:
    from types import SimpleNamespace

    from trainer.clip import tokenizer_of

    named = SimpleNamespace(job=SimpleNamespace(captions=SimpleNamespace(tokenizer="/data/v1/tokenizer.json")))
    assert tokenizer_of(SimpleNamespace(tokenizer="mine.json"), named) == "mine.json"
    assert tokenizer_of(SimpleNamespace(tokenizer=""), named) == "/data/v1/tokenizer.json"
    with pytest.raises(ValueError, match="give --tokenizer FILE .* or train on a pair dataset written with"):
        tokenizer_of(SimpleNamespace(tokenizer=""), SimpleNamespace(job=SimpleNamespace(captions=None)))
