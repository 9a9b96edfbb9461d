"""shardify's reading side: manifest, storage, the sample plan, readers, decoders and the torch loader.

`from dataio import make_loader` is the entry point for training code. The loader's names are
imported lazily so that `import dataio.manifest` (e.g. by the `shardify` CLI) does not pull in torch.
"""

from __future__ import annotations

from typing import Any

from dataio.errors import (
    CorruptSampleError,
    ImageTooLargeError,
    ManifestError,
    ShardFormatError,
    ShardifyError,
    StateError,
    StorageError,
    StorageNotFoundError,
    UnverifiedDataWarning,
    VerifyCostWarning,
)

_LAZY = {
    "make_loader": "dataio.loader.make",
    "ShardLoader": "dataio.loader.shard_loader",
    "LoaderConfig": "dataio.loader.config",
    "Source": "dataio.loader.config",
    "LoaderStats": "dataio.loader.stats",
    "StorageOptions": "dataio.storage.store",
    "sources_of": "dataio.format.provenance",
}

__all__ = [
    "CorruptSampleError", "ImageTooLargeError", "ManifestError", "ShardFormatError", "ShardifyError",
    "StateError", "StorageError", "StorageNotFoundError", "UnverifiedDataWarning", "VerifyCostWarning",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dataio' has no attribute {name!r}")
