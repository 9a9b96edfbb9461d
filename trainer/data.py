"""The trainer's side of the loader: open train/validation loaders and turn batches into tensors."""

from __future__ import annotations

from typing import Any

import torch

from dataio.storage.store import StorageOptions
from trainer.config import DataSource, TrainConfig
from trainer.synthetic import synthetic_loader

SYNTHETIC = "synthetic:"


def storage_options(cfg: TrainConfig) -> StorageOptions:
    """Storage options from flags, then --storage-config's [s3] table, then AWS_* variables."""
    import os

    return StorageOptions.resolve(endpoint_url=cfg.s3_endpoint_url or None, region=cfg.s3_region or None,
                                  config_path=cfg.storage_config or None, env=os.environ)


def open_loader(cfg: TrainConfig, url: str | tuple[DataSource, ...], *, rank: int, world_size: int, train: bool,
                pin_memory: bool = False) -> Any:
    """A loader for one rank: train splits drop the tail; validation pads it (mask marks repeats).
    A tuple of DataSource opens a weighted mixture (batches carry each sample's source index)."""
    tail = "drop" if train else "pad"
    if isinstance(url, tuple):
        from dataio import Source

        url = [Source(s.url, weight=s.weight) for s in url]  # type: ignore[assignment]
    elif url.startswith(SYNTHETIC):
        return synthetic_loader(url, batch_size=cfg.batch_size, rank=rank, world_size=world_size,
                                seed=cfg.seed, image_size=cfg.image_size, tail=tail, train=train)
    from dataio.loader.shard_loader import make_loader

    tabular = bool(cfg.feature_names)  # rows of numeric columns: no image decode, only the columns needed
    return make_loader(url, batch_size=cfg.batch_size, num_workers=cfg.num_workers, seed=cfg.seed,
                       rank=rank, world_size=world_size, decode=None if tabular else cfg.decode,
                       fields=(*cfg.feature_names, "cls") if tabular else None, image_size=cfg.image_size,
                       train=train and cfg.augment, tail=tail, shuffle=train, storage=storage_options(cfg),
                       pin_memory=pin_memory)


def num_classes_of(cfg: TrainConfig, loader: Any) -> int:
    """--num-classes, else the dataset's label names (manifest) or synthetic class count."""
    if cfg.num_classes:
        return cfg.num_classes
    known = getattr(loader, "num_classes", None)
    manifest = getattr(loader, "manifest", None)
    if known is None and manifest is not None and manifest.label_names:
        known = len(manifest.label_names)
    if not known:
        raise ValueError(f"{cfg.data_label}: the manifest names no labels; pass --num-classes N")
    return int(known)


def fingerprint_of(loader: Any) -> str:
    """The dataset's identity, for checkpoints: the manifest fingerprint (a mixture's combined one,
    or the synthetic URL)."""
    if getattr(loader, "mixture", None) is not None:
        return str(loader.fingerprint)
    manifest = getattr(loader, "manifest", None)
    return str(manifest.fingerprint if manifest is not None else getattr(loader, "fingerprint", "unknown"))


def mixture_facts(loader: Any) -> tuple[list[str], list[float]]:
    """(source URLs, requested shares) of a mixture loader, for the report."""
    mixture = loader.mixture
    return [s.name for s in mixture.sources], [int(c) / max(1, mixture.total) for c in mixture.counts]


def job_facts(loader: Any) -> dict[str, Any]:
    """What the scaling prediction needs to know of the dataset: its samples and stored bytes per sample."""
    mixture = getattr(loader, "mixture", None)
    if mixture is not None:  # an epoch of the mixture; its mean sample weighted by the sources' counts
        manifests = loader.sources.manifests
        per_sample = sum(int(c) * m.num_bytes / max(1, m.num_samples) for c, m in zip(mixture.counts, manifests))
        return {"dataset_samples": int(mixture.total), "bytes_per_sample": per_sample / max(1, mixture.total)}
    manifest = getattr(loader, "manifest", None)
    if manifest is not None:
        samples = int(manifest.num_samples)
        return {"dataset_samples": samples, "bytes_per_sample": manifest.num_bytes / max(1, samples)}
    images = getattr(loader, "images", None)  # the synthetic loader: uint8 images served from memory
    per_sample = float(images[0].numel() * images.element_size()) if images is not None else 0.0
    return {"dataset_samples": int(getattr(loader, "num_samples", 0)), "bytes_per_sample": per_sample}


def check_labels(batch: dict[str, Any], num_classes: int, loader: Any = None) -> None:
    """ValueError naming the shard and key of the first real sample whose label is outside
    [0, num_classes) (cross-entropy would fail with a bare IndexError, or a CUDA assert)."""
    labels, mask = batch["label"], batch["mask"]
    bad = ((labels < 0) | (labels >= num_classes)) & mask
    if not bool(bad.any()):
        return
    i = int(bad.nonzero()[0, 0])
    where = ""
    shards = batch.get("__shard__")
    if shards is not None:
        shard = int(shards[i])
        manifest = getattr(loader, "manifest", None)
        store = getattr(loader, "store", None)
        where = f" in shard {shard}"
        if manifest is not None and store is not None:
            where = f" in shard {store.url_of(manifest.shard_paths[shard])}"
    raise ValueError(
        f"sample {batch['__key__'][i]!r}{where} has label {int(labels[i])}, outside the model's "
        f"{num_classes} classes (0..{num_classes - 1}); fix --num-classes or the dataset's labels"
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


def close(loader: Any) -> None:
    closer = getattr(loader, "close", None)
    if closer is not None:
        closer()
