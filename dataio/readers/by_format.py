"""The chooser: the reader for a manifest's format, above the readers it picks from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dataio.format.manifest import Manifest
from dataio.readers.base import SegmentReader
from dataio.readers.tar import TarReader
from dataio.storage.store import Store

if TYPE_CHECKING:
    from dataio.storage.cache import DiskCache


def make_reader(
    store: Store,
    manifest: Manifest,
    *,
    fields: Sequence[str] | None = None,
    verify_index: bool = True,
    cache: DiskCache | None = None,
    slice_bytes: int | None = None,
    verify_checksums: bool = False,
) -> SegmentReader:
    """The reader for the manifest's format; `fields` projects samples to those fields (plus __key__);
    Parquet row groups holding more than slice_bytes are read in slices; verify_checksums checks
    what is read against the per-sample / per-row-group checksums of a version-3 manifest."""
    if manifest.format == "tar":
        return TarReader(store, manifest, fields=fields, verify_index=verify_index, cache=cache,
                         verify_checksums=verify_checksums)
    from dataio.readers.parquet import ParquetReader  # here: pyarrow.parquet costs a tar-only process 0.1-0.4 s

    return ParquetReader(store, manifest, fields=fields, cache=cache, slice_bytes=slice_bytes,
                         verify_checksums=verify_checksums)
