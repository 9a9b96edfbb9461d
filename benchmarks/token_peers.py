"""The token loaders the benchmark compares, one per child process (benchmarks/bench_tokens.py):
shardify's token loader, nanoGPT's np.memmap get_batch, LitData's StreamingDataset + TokensLoader,
Megatron-Core's GPTDataset, and tokenization by `datasets.map`. A child prints one JSON line of what it measured.

    python -m benchmarks.token_peers '{"loader": "shardify", ...}'
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


def shardify_batches(spec: dict[str, Any]) -> Iterator[int]:
    """Tokens of input per batch of shardify's loader, epoch after epoch (every token once per epoch)."""
    from dataio import make_loader

    fields = ("input_ids",) if spec["ids_only"] else None
    loader = make_loader(spec["url"], seq_len=spec["seq_len"], batch_size=spec["batch_size"],
                         num_workers=spec["num_workers"], rank=0, world_size=1, fields=fields)
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        for batch in loader:
            yield int(batch["input_ids"].shape[0]) * (int(batch["input_ids"].shape[1]) - 1)
        epoch += 1


def memmap_batches(spec: dict[str, Any]) -> Iterator[int]:
    """nanoGPT's get_batch: random windows with replacement from one np.memmap (not exactly once)."""
    import torch

    L, B = spec["seq_len"], spec["batch_size"]
    gen = torch.Generator().manual_seed(0)
    while True:
        data = np.memmap(spec["bin"], dtype=np.uint16, mode="r")  # nanoGPT re-opens it per batch
        ix = torch.randint(len(data) - L - 1, (B,), generator=gen)
        x = torch.stack([torch.from_numpy(data[i:i + L + 1].astype(np.int64)) for i in ix.tolist()])
        yield int(x.shape[0]) * L


def litdata_batches(spec: dict[str, Any]) -> Iterator[int]:
    """LitData's StreamingDataset with TokensLoader blocks of seq_len + 1, through its StreamingDataLoader."""
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    L = spec["seq_len"]
    dataset = StreamingDataset(spec["litdata"], item_loader=TokensLoader(block_size=L + 1), shuffle=True,
                               drop_last=True, seed=0)
    loader = StreamingDataLoader(dataset, batch_size=spec["batch_size"], num_workers=spec["num_workers"])
    epoch = 0
    while True:
        dataset.set_epoch(epoch + 1)
        for batch in loader:
            yield int(batch.shape[0]) * L
        epoch += 1


def write_litdata(spec: dict[str, Any]) -> dict[str, Any]:
    """LitData chunks of the same documents (from the token shards, as int32 tensors: no uint16 there)."""
    from litdata import TokensLoader, optimize

    start = time.perf_counter()
    optimize(fn=litdata_documents, inputs=spec["shards"], output_dir=spec["litdata"], chunk_size=(8192 + 1) * 64,
             item_loader=TokensLoader(), num_workers=2, mode="overwrite")
    return {"seconds": time.perf_counter() - start}


class _MegatronTokenizer:
    """What GPTDataset asks of a tokenizer: vocab_size, eod (and pad for padded samples)."""

    def __init__(self, vocab_size: int, eod: int) -> None:
        self.vocab_size, self.eod, self.pad = vocab_size, eod, eod
        self.unique_identifiers = {"class": "bench", "vocab_size": vocab_size, "eod": eod}  # for its cache key


def megatron_batches(spec: dict[str, Any]) -> Iterator[int]:
    """Megatron-Core's GPTDataset (its .bin/.idx, sample index built once, shuffled) through a DataLoader;
    position ids reset at each EOD, no attention mask (as with a flash kernel)."""
    import torch
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    L, B = spec["seq_len"], spec["batch_size"]
    config = GPTDatasetConfig(random_seed=0, sequence_length=L, blend=([spec["megatron"]], None), split="100,0,0",
                              tokenizer=_MegatronTokenizer(spec["vocab_size"], spec["eos_id"]),
                              reset_position_ids=True, reset_attention_mask=False, eod_mask_loss=False,
                              create_attention_mask=False, path_to_cache=spec["megatron"] + "-cache")
    num_samples = spec["num_tokens"] // L
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [num_samples, None, None], lambda: True, config).build()
    loader = torch.utils.data.DataLoader(train, batch_size=B, num_workers=spec["num_workers"], drop_last=True)
    while True:
        for batch in loader:
            yield int(batch["tokens"].shape[0]) * L


def write_megatron(spec: dict[str, Any]) -> dict[str, Any]:
    """Megatron's indexed dataset (.bin/.idx, uint16) of the same documents."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    start = time.perf_counter()
    builder = IndexedDatasetBuilder(spec["megatron"] + ".bin", dtype=np.uint16)
    for shard in spec["shards"]:
        for doc in litdata_documents(shard):
            builder.add_document(doc, [len(doc)])
    builder.finalize(spec["megatron"] + ".idx")
    return {"seconds": time.perf_counter() - start}


def litdata_documents(shard: str) -> Iterator[Any]:
    """One shard's documents as int32 tensors (optimize's fn: module level, its workers are spawned)."""
    import torch

    tokens = np.fromfile(shard, dtype=np.uint16)
    offsets = np.fromfile(shard.rsplit(".", 1)[0] + ".idx", dtype=np.int64)
    for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        yield torch.from_numpy(tokens[a:b].astype(np.int32))


def datasets_map(spec: dict[str, Any]) -> dict[str, Any]:
    """Tokens/s of `datasets.map` with the same tokenizer.json (batched, 2 processes), EOS appended."""
    import datasets
    from tokenizers import Tokenizer

    datasets.disable_progress_bars()
    tok = Tokenizer.from_file(spec["tokenizer"])
    eos = spec["eos_id"]

    def encode(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        return {"ids": [e.ids + [eos] for e in tok.encode_batch(batch["text"])]}

    ds = datasets.load_dataset("json", data_files=spec["jsonl"], split="train", cache_dir=spec["cache"])
    start = time.perf_counter()
    out = ds.map(encode, batched=True, batch_size=256, num_proc=2, remove_columns=ds.column_names,
                 load_from_cache_file=False)
    seconds = time.perf_counter() - start
    num_tokens = sum(len(ids) for ids in out["ids"])
    return {"seconds": seconds, "tokens": num_tokens, "tokens_per_s": num_tokens / seconds}


LOADERS = {"shardify": shardify_batches, "memmap": memmap_batches, "litdata": litdata_batches,
           "megatron": megatron_batches}
TASKS = {"write_litdata": write_litdata, "write_megatron": write_megatron, "datasets_map": datasets_map}


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Time to the first batch, then tokens/s over the next spec["batches"] batches."""
    start = time.perf_counter()
    batches = LOADERS[spec["loader"]](spec)
    next(batches)
    first_s = time.perf_counter() - start
    tokens, t0 = 0, time.perf_counter()
    for _ in range(spec["batches"]):
        tokens += next(batches)
    seconds = time.perf_counter() - t0
    return {"first_batch_s": first_s, "tokens_per_s": tokens / seconds, "seconds": seconds}


def main() -> None:
    spec = json.loads(sys.argv[1])
    result = TASKS[spec["task"]](spec) if "task" in spec else measure(spec)
    print(json.dumps(result), flush=True)
    sys.stdout.flush()
    if "loader" in spec:  # workers of a loader left mid-epoch: leave at once, as a benchmark child may
        import os

        os._exit(0)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
