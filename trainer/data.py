"""The trainer's side of the loader: open train/validation loaders and turn batches into tensors."""

from __future__ import annotations

import json
from typing import Any

import torch

from dataio.decode.images import IMAGE_EXTS
from dataio.format.manifest import Manifest
from dataio.loader.protocol import TrainLoader
from dataio.storage.store import StorageOptions
from trainer.clip import CLIP_MODELS
from trainer.config import DataSource, TrainConfig
from trainer.loader_options import make_options
from trainer.synthetic import synthetic_loader

SYNTHETIC = "synthetic:"
TOKENS, SAMPLES = "tokens", "samples"  # what a dataset holds: token documents, or samples (images, table rows)


def storage_options(cfg: TrainConfig) -> StorageOptions:
    """Storage options from flags, then --storage-config's [s3] table, then AWS_* variables."""
    import os

    return StorageOptions.resolve(endpoint_url=cfg.s3_endpoint_url or None, region=cfg.s3_region or None,
                                  config_path=cfg.storage_config or None, env=os.environ)


def open_loader(cfg: TrainConfig, url: str | tuple[DataSource, ...], *, rank: int, world_size: int, train: bool,
                pin_memory: bool = False, label_names: tuple[str, ...] | None = None) -> TrainLoader:
    """A loader for one rank: train splits drop the tail; validation pads it (mask marks repeats) and
    reads its labels in the training loader's `label_names`. One make_loader call for every kind of
    dataset (the manifests say which, and it must fit --model), one dataset or a weighted mixture."""
    sources = (DataSource(url),) if isinstance(url, str) else url
    if sources[0].url.startswith(SYNTHETIC):  # never mixed (TrainConfig refuses it); a weight alone is moot
        check_fits(cfg.model, [(sources[0].url, SAMPLES, "images (synthetic data)")])
        return synthetic_loader(sources[0].url, batch_size=cfg.batch_size, rank=rank, world_size=world_size,
                                seed=cfg.seed, image_size=cfg.image_size, tail="drop" if train else "pad", train=train)
    from dataio import Source
    from dataio.format.manifest import read_manifest
    from dataio.loader.make import make_loader
    from dataio.storage.store import Store

    storage = storage_options(cfg)
    manifests = [read_manifest(Store(s.url, storage)) for s in sources]
    kind = check_fits(cfg.model, [(s.url, TOKENS if m.format == "tokens" else SAMPLES, _holds(m))
                                  for s, m in zip(sources, manifests)])
    space = label_space_of(cfg) if train else val_label_space(label_names, sources, manifests)
    options = loader_options(cfg, kind, mixed=len(sources) > 1, train=train, storage=storage, label_space=space)
    loader = make_loader([Source(s.url, weight=s.weight) for s in sources], rank=rank, world_size=world_size,
                         pin_memory=pin_memory, **options)
    try:
        if kind != TOKENS and not (cfg.model in CLIP_MODELS and train):  # pairs train on captions, not labels
            check_labelled(loader)
    except ValueError:
        loader.close()
        raise
    return loader


CLIP_CONTEXT_LENGTH = 32  # --model clip's caption tokens when --context-length is not given


def clip_context_length(cfg: TrainConfig) -> int:
    """The caption length of --model clip: --context-length, else CLIP_CONTEXT_LENGTH (the loader's None
    means captions stay text)."""
    return cfg.context_length or CLIP_CONTEXT_LENGTH


def loader_options(cfg: TrainConfig, kind: str, *, mixed: bool, train: bool, storage: StorageOptions,
                   label_space: str | dict[str, Any]) -> dict[str, Any]:
    """make_loader's keywords: the config's loader group as given, and what the split and the
    dataset's kind decide (tail, shuffle, augmentation, a mixture's epoch and schedule, the labels)."""
    from dataio.plan.schedule import Schedule

    derived: dict[str, Any] = {
        "tail": "drop" if train else "pad", "shuffle": train, "storage": storage,
        "epoch_samples": cfg.epoch_samples if train and mixed else None,  # a mixture's epoch
        # --mix-schedule, pieces in samples (sequences for tokens): make_loader's weights=Schedule, as its pieces
        "mix_schedule": Schedule.parse(cfg.mix_schedule).pieces if cfg.mix_schedule and train else None,
    }
    if kind == TOKENS:  # batches of packed sequences (trainer/gpt.py); tokens are mixed by token share
        return make_options(cfg.loader, **derived)
    if cfg.model in CLIP_MODELS and train:  # image-text pairs, captions tokenized in the workers (trainer/clip.py)
        return make_options(cfg.loader, **derived, seq_len=None, train=cfg.augment,
                            context_length=clip_context_length(cfg))
    tabular = bool(cfg.feature_names)  # rows of numeric columns: no image decode, only the columns needed
    return make_options(cfg.loader, **derived, seq_len=None, context_length=None, train=train and cfg.augment,
                        label_space=label_space,
                        decode=None if tabular else cfg.decode, fields=(*cfg.feature_names, "cls") if tabular else None)


def check_fits(model: str, kinds: list[tuple[str, str, str]]) -> str:
    """The kind (TOKENS or SAMPLES) of the sources' (url, kind, what it holds); ValueError in one
    sentence naming --model and the dataset when they do not fit, or when a mixture mixes kinds."""
    url, kind, holds = kinds[0]
    other = next((k for k in kinds if k[1] != kind), None)
    if other is not None:
        raise ValueError(f"--data mixes token datasets and datasets of samples: {url} holds {holds}, {other[0]} "
                         f"holds {other[2]}; mix datasets of one kind")
    if model == "gpt" and kind != TOKENS:
        raise ValueError(f"--model gpt trains on token datasets; {url} holds {holds}: train it with a classifier "
                         "(--model resnet, mlp, ...), or give a token dataset (`shardify write SRC DEST "
                         "--tokenizer FILE`)")
    if model != "gpt" and kind == TOKENS:
        raise ValueError(f"--model {model} is a classifier of samples; {url} holds {holds}: train token datasets "
                         "with --model gpt")
    return kind


def _holds(manifest: Manifest) -> str:
    """What a manifest's dataset holds, for messages: tokens, images or table rows, and its fields."""
    if manifest.format == "tokens":
        return f"tokens (a token dataset of {sum(manifest.shard_num_tokens)} tokens)"
    names = list(manifest.field_names)
    images = any(f.type == "image" for f in manifest.fields) or set(names) & set(IMAGE_EXTS)
    return f"{'images' if images else 'table rows'} ({manifest.format} shards; fields: {', '.join(names[:8])})"


def check_labelled(loader: TrainLoader) -> None:
    """ValueError naming the first source with no label field: the trainer needs one from each."""
    for source in loader.facts.sources:
        if not source.has_labels:
            raise ValueError(f"{source.url}: this dataset has no label field (a `cls` member or column, or an "
                             f"integer `label` column; its fields: {list(source.field_names)}); the trainer "
                             "needs labels from every --data source")


def val_label_space(train_names: tuple[str, ...] | None, val: tuple[DataSource, ...],
                    manifests: list[Manifest]) -> str | dict[str, int]:
    """Validation labels in the training label space (the training loader's label names): by name, when
    both name their labels (a validation label the training space lacks is refused); else "same"."""
    if train_names is None or any(m.label_names is None for m in manifests):
        return "same"
    unknown = [n for m in manifests for n in m.label_names or () if n not in train_names]
    if unknown:
        raise ValueError(f"--val-data {val[0].url} has labels {unknown[:10]} that the training data does "
                         f"not name (its label space: {list(train_names)[:20]}); validate on the same classes")
    return {name: i for i, name in enumerate(train_names)}


def label_space_of(cfg: TrainConfig) -> str | dict[str, Any]:
    """--label-space, or the map read from --label-map FILE (JSON); ValueError naming the file."""
    if not cfg.label_map:
        return cfg.label_space
    try:
        with open(cfg.label_map, encoding="utf-8") as f:
            mapping = json.load(f)
    except OSError as exc:
        raise ValueError(f"--label-map {cfg.label_map}: cannot read it ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--label-map {cfg.label_map}: not valid JSON ({exc})") from None
    if not isinstance(mapping, dict) or not mapping:
        raise ValueError(f"--label-map {cfg.label_map}: must hold a JSON object {{\"SOURCE\": {{\"NAME\": INDEX}}}} "
                         "or {\"NAME\": INDEX}")
    return mapping


def num_classes_of(cfg: TrainConfig, loader: TrainLoader) -> int:
    """--num-classes, else the size of the loader's label space (the sources' label names, one
    space for a mixture) or the synthetic class count."""
    if cfg.num_classes:
        return cfg.num_classes
    if not loader.num_classes:
        raise ValueError(f"{cfg.data_label}: the manifest names no labels; pass --num-classes N")
    return int(loader.num_classes)


def fingerprint_of(loader: TrainLoader) -> str:
    """The dataset's identity, for checkpoints: the manifest fingerprint (a mixture's combined one,
    or the synthetic URL), and the label space when it remaps labels."""
    return loader.facts.identity


def mixture_facts(loader: TrainLoader) -> tuple[list[str], list[float]]:
    """(source URLs, requested shares) of a mixture loader, for the report."""
    sources = loader.facts.sources
    return [s.url for s in sources], [s.share for s in sources]


def requested_at(loader: TrainLoader, samples_seen: int) -> list[float] | None:
    """A scheduled mixture's requested shares at the run's sample `samples_seen` (the report's
    requested column follows the schedule); None for fixed weights."""
    return loader.shares_at(samples_seen)


def job_facts(loader: TrainLoader) -> dict[str, Any]:
    """What the scaling prediction needs to know of the dataset: its samples and stored bytes per sample."""
    facts = loader.facts
    return {"dataset_samples": facts.num_samples, "bytes_per_sample": facts.bytes_per_sample}


def check_labels(batch: dict[str, Any], num_classes: int, loader: TrainLoader | None = None) -> None:
    """ValueError naming the source, shard and key of the first real sample whose label is outside
    [0, num_classes) (cross-entropy would fail with a bare IndexError, or a CUDA assert). Each
    source's labels were checked against its own manifest by the loader; this checks the model's."""
    labels, mask = batch["label"], batch["mask"]
    bad = ((labels < 0) | (labels >= num_classes)) & mask
    if not bool(bad.any()):
        return
    i = int(bad.nonzero()[0, 0])
    where = loader.where(batch, i) if loader is not None else ""
    raise ValueError(
        f"sample {batch['__key__'][i]!r}{where} has label {int(labels[i])}, outside the "
        f"model's {num_classes} classes (0..{num_classes - 1}); fix --num-classes or the dataset's labels"
    )


def to_device(batch: dict[str, Any], device: torch.device,
              features: tuple[str, ...] = ()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs, labels int64 [N], mask bool [N]) on `device`; inputs are images float [N,3,H,W] in
    [-1, 1], or with `features` the rows float32 [N, F] of those columns."""
    non_blocking = device.type == "cuda"
    labels = batch["label"].to(device, non_blocking=non_blocking)
    mask = batch["mask"].to(device, non_blocking=non_blocking)
    if features:
        missing = [f for f in features if not isinstance(batch.get(f), torch.Tensor)]
        if missing:
            raise ValueError(f"--features {missing} are not numeric columns of this dataset's batches "
                             f"(it has {sorted(k for k in batch if not k.startswith('__'))})")
        rows = torch.stack([batch[f].to(torch.float32) for f in features], dim=1)  # [N, F]
        return rows.to(device, non_blocking=non_blocking), labels, mask
    if "image" not in batch:
        raise ValueError("batches have no 'image' field: the trainer needs decoded images (--decode cpu|dali), "
                         "or --features COLS for table rows")
    image = batch["image"].to(device, non_blocking=non_blocking)
    return image.float().div_(127.5).sub_(1.0), labels, mask


def describe_loader(loader: TrainLoader) -> str:
    """The loader's execution plan in one line (its describe(), where the loader has one), for the report."""
    describe = getattr(loader, "describe", None)
    return str(describe()) if callable(describe) else f"{type(loader).__name__} (its plan is not described)"


def close(loader: TrainLoader) -> None:
    loader.close()
