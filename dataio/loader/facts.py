"""The TrainLoader facts of an opened loader (protocol.py): identity, size, sources, where a sample lies."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from dataio.loader.labels import LabelSpace
from dataio.loader.mixing import OpenSources
from dataio.loader.protocol import DatasetFacts, SourceFacts
from dataio.stream.fields import label_field


def dataset_facts(opened: OpenSources, labels: LabelSpace) -> DatasetFacts:
    """The facts of these sources (one dataset: a mixture of one) read in this label space."""
    mixture = opened.mixture
    total = max(1, mixture.total)
    stored = sum(int(c) * m.num_bytes / max(1, m.num_samples) for c, m in zip(mixture.counts, opened.manifests))
    identity = opened.fingerprint
    if labels.remaps:  # labels remapped: the same data means other classes
        text = json.dumps(labels.describe(), sort_keys=True)
        identity = f"{identity}+labels-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    return DatasetFacts(
        identity=identity, num_samples=int(mixture.total), bytes_per_sample=stored / total, mixed=not mixture.single,
        sources=tuple(SourceFacts(url=store.url, share=int(c) / total, field_names=tuple(m.field_names),
                                  has_labels=label_field(m) in m.field_names)
                      for store, m, c in zip(opened.stores, opened.manifests, mixture.counts)))


def where(opened: OpenSources, batch: dict[str, Any], i: int) -> str:
    """' in shard URL' (' of source N (URL)' in a mixture) for sample i of a batch; '' without __shard__."""
    shards = batch.get("__shard__")
    if shards is None:
        return ""
    shard, source = int(shards[i]), int(batch["source"][i]) if "source" in batch else 0
    store, manifest = opened.stores[source], opened.manifests[source]
    text = f" in shard {store.url_of(manifest.shard_paths[shard])}"
    return text if opened.mixture.single else f"{text} of source {source + 1} ({store.url})"
