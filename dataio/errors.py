"""The error hierarchy for data problems: each message names the URL, the sample key and the fix.

Bad arguments raise ValueError / TypeError; everything below is about data or storage that is
not what the manifest promised.
"""

from __future__ import annotations


class ShardifyError(Exception):
    """Base of every data-side error shardify raises on purpose."""


class ManifestError(ShardifyError):
    """A dataset's manifest is missing, unreadable, of an unknown version or unsafe."""


class ShardFormatError(ShardifyError):
    """A shard or its index does not match the manifest (size, checksum, layout)."""


class CorruptSampleError(ShardFormatError):
    """One sample cannot be parsed or decoded; carries the shard URL and the sample key."""

    def __init__(self, message: str, *, url: str = "", key: str = "") -> None:
        super().__init__(message)
        self.url = url
        self.key = key


class ImageTooLargeError(CorruptSampleError):
    """An image declares more pixels than the configured limit (a decompression bomb guard)."""


class StorageError(ShardifyError):
    """Reading or writing storage failed after retries; the URL in the message is redacted.

    Test `exc.not_found` (True when the path or bucket does not exist), never the message. The
    storage error that caused it is chained as `__cause__` (a redacted stand-in if its text held
    credentials).
    """

    not_found: bool = False


class StorageNotFoundError(StorageError):
    """The path (or its bucket) does not exist; a class of its own so the flag survives pickling."""

    not_found = True


class UnverifiedDataWarning(UserWarning):
    """verify_checksums=True on a dataset written before per-sample checksums: it is read unverified."""


class VerifyCostWarning(UserWarning):
    """verify_checksums=True reads some of a dataset's bytes twice to check them before delivery
    (Parquet without page checksums, read in slices); the message says what avoids it."""


class StateError(ShardifyError):
    """A saved loader state does not fit this loader (dataset, seed, batch size, plan version)."""
