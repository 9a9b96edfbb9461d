"""What a training loop reads of a loader: TrainLoader, a typing.Protocol, and the dataset facts.

ShardLoader implements it, and so may any loader a trainer is given (the trainer's synthetic
in-memory loader does): iteration, length and epochs, the Stateful pair, the label space, the
stats the loader counted, and facts about the data (its identity for checkpoints, its size and
mean stored sample, its sources) — attributes, never probed for.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from dataio.loader.stats import LoaderStats


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceFacts:
    """One dataset a loader reads (a single dataset: the only one)."""

    url: str  # redacted
    share: float  # its share of the requested epoch
    field_names: tuple[str, ...]
    has_labels: bool  # it has a label field (a `cls` member or column, or an integer `label` column)


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetFacts:
    """What a loader's data is: its identity for checkpoints, size, mean stored sample, sources."""

    identity: str  # the data's fingerprint (a mixture's combined one), + the label space when it remaps labels
    num_samples: int  # one epoch as requested (a mixture: epoch_samples)
    bytes_per_sample: float  # the mean stored sample (a mixture: weighted by the sources' shares)
    mixed: bool  # a real mixture: batches carry each sample's "source"
    sources: tuple[SourceFacts, ...]


@runtime_checkable
class TrainLoader(Protocol):
    """What the trainer reads of a loader."""

    label_names: tuple[str, ...] | None  # the batches' label names (None: the data names none)
    num_classes: int | None  # classes of the label space, when known
    stats: LoaderStats | None  # what the loader counted (None: nothing to count)

    @property
    def facts(self) -> DatasetFacts: ...

    def where(self, batch: dict[str, Any], i: int) -> str:
        """' in shard URL' (+ ' of source N (URL)' in a mixture) for sample i of a batch, or ''."""
        ...

    def shares_at(self, samples_seen: int) -> list[float] | None:
        """A scheduled mixture's requested shares at the run's sample `samples_seen`; None otherwise."""
        ...

    def sources_added_since(self, state_dict: dict[str, Any]) -> int:
        """Sources appended since `state_dict` was saved (a scheduled mixture may gain some on resume); 0 otherwise."""
        ...

    def __iter__(self) -> Iterator[dict[str, Any]]: ...
    def __len__(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...
    def close(self) -> None: ...
