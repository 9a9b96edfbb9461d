"""A loader over several datasets: which sources, opening them, checking their batches agree.

make_loader([url_a, url_b], weights=[...]) or make_loader([Source(url, weight=...), ...]) opens
every source (tar or Parquet, local or s3://) and builds the pure plan's Mixture (plan/mix.py).
Every batch holds the same fields whatever source its samples come from: each sample's image
(from whichever image field it has: a folder's jpg/png/webp, a Hugging Face export's `image`),
its label, and the other fields all sources share (or those `fields` names: a source that lacks
one is refused, naming it). Their labels share one space (loader/labels.py). One shuffle window
(in samples, sized from the mixture's mean sample bytes) and one prefetch budget serve all
sources together: a mixture needs no more memory than one dataset.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dataio.decode.images import order_image_fields
from dataio.errors import ManifestError
from dataio.format.manifest import Manifest, label_field
from dataio.loader.config import LoaderConfig, Source
from dataio.loader.labels import LabelSpace, SourceLabels, build_label_space
from dataio.loader.startup import fields_to_read, image_fields_of, open_dataset
from dataio.loader.state import mixture_fingerprint
from dataio.plan.mix import MixSource, Mixture
from dataio.plan.schedule import scheduled
from dataio.readers.base import sample_url_of
from dataio.storage.store import Store


def as_sources(url: str | Source | Sequence[str | Source], weights: Sequence[float] | None) -> list[Source]:
    """The sources a loader reads, in order: one URL is a mixture of one (plan/mix.py, Mixture.single)."""
    if isinstance(url, (str, Source)):
        items: list[Any] = [url]
    else:
        items = list(url)
    if not items:
        raise ValueError("make_loader needs a dataset URL, or a non-empty list of URLs or Source objects")
    if weights is not None:
        weights = list(weights)
        if len(weights) != len(items) or any(isinstance(i, Source) for i in items):
            raise ValueError(f"weights= takes one weight per URL ({len(items)} URLs, {len(weights)} weights); "
                             "Source objects carry their own weight")
        items = [Source(u, weight=w) for u, w in zip(items, weights)]
    return [i if isinstance(i, Source) else Source(i) for i in items]


def mixed_url_of(opened: OpenSources) -> Callable[[int], str]:
    """Global sample id (sources concatenated) -> redacted URL of its shard, as sample_url_of."""
    bases = [int(b) for b in opened.mixture.id_base]
    per_source = [sample_url_of(store, m) for store, m in zip(opened.stores, opened.manifests)]

    def url_of(sample_id: int) -> str:
        s = bisect.bisect_right(bases, int(sample_id)) - 1
        s = min(s, len(per_source) - 1)
        return per_source[s](int(sample_id) - bases[s])

    return url_of


@dataclass(frozen=True, kw_only=True)
class OpenSources:
    """The opened sources (one dataset: a mixture of one): stores and manifests in source order,
    and the plan's Mixture."""

    stores: tuple[Store, ...]
    manifests: tuple[Manifest, ...]
    mixture: Mixture

    @property
    def fingerprint(self) -> str:
        """The data's identity: a single dataset's manifest fingerprint, or a mixture's description
        (every source's manifest fingerprint, weights, epoch; not a schedule's pieces) hashed."""
        if self.mixture.single:
            return self.manifests[0].fingerprint
        return mixture_fingerprint(self.mixture.describe())  # pieces yet to come may change (state.py checks)


def open_sources(sources: Sequence[Source], config: LoaderConfig) -> OpenSources:
    """Open every source with the single-dataset start-up checks and build the Mixture. `fields`
    names fields of any source (a tar `jpg` and a Parquet `image`): each reads those it has (one
    source: it must have them all)."""
    own = config if len(sources) == 1 else dataclasses.replace(config, fields=None)
    opened = [open_dataset(s.url, own) for s in sources]
    stores = tuple(store for store, _ in opened)
    manifests = tuple(manifest for _, manifest in opened)
    unknown = [f for f in config.fields or () if not any(f in m.field_names for m in manifests)]
    if unknown:
        raise ManifestError(f"fields {unknown} are in none of the mixed sources {[s.url for s in stores]} "
                            f"(their fields: {sorted({f for m in manifests for f in m.field_names})})")
    mix_sources = tuple(
        MixSource(name=store.url, shard_sizes=m.shard_num_samples, weight=s.weight, repeat=s.repeat,
                  fingerprint=m.fingerprint)
        for s, store, m in zip(sources, stores, manifests))
    try:
        mixture = (Mixture(sources=mix_sources, epoch_samples=config.epoch_samples) if config.mix_schedule is None
                   else scheduled(mix_sources, config.mix_schedule, config.epoch_samples))
    except ValueError as exc:
        raise ValueError(f"make_loader: cannot mix {[s.url for s in stores]}: {exc}") from None
    for s, store, m in zip(mix_sources, stores, manifests):
        if not mixture.single and m.num_samples == 0 and ((s.weight or 0) > 0 or (s.repeat or 0) > 0):
            raise ManifestError(f"{store.url}: this source has no samples but a weight in the mixture; "
                                "remove it or give it weight 0")
    return OpenSources(stores=stores, manifests=manifests, mixture=mixture)


@dataclass(frozen=True, kw_only=True)
class MixedFields:
    """What the sources' readers read and a mixed batch holds."""

    image_fields: tuple[str, ...]  # every source's image fields, in pick order (IMAGE_FIELD_ORDER)
    projections: tuple[tuple[str, ...] | None, ...]  # each source's reader projection (None: all)
    label_fields: tuple[str, ...]  # each source's label field, renamed to the first's when read


def batch_fields(opened: OpenSources, config: LoaderConfig) -> MixedFields:
    """What each source reads so that every batch has the same fields: each sample's image
    (decoded into "image" from whichever image field it has, whatever its format; raw, every
    source's image fields), its label as "label", and the other fields named in `fields` (each
    source must have them, else ManifestError naming the field and the source), or with
    fields=None those that all sources share."""
    manifests, urls = opened.manifests, [store.url for store in opened.stores]
    labels = tuple(label_field(m) for m in manifests)
    if opened.mixture.single:  # one dataset: its own image fields and projection, whatever others share
        image_fields, projection = fields_to_read(manifests[0], config, urls[0])
        return MixedFields(image_fields=image_fields, projections=(projection,), label_fields=labels)
    images = [image_fields_of(m) for m in manifests]
    others = [[f for f in m.field_names if f not in imgs and f != label]
              for m, imgs, label in zip(manifests, images, labels)]
    if config.fields is None:
        extras = [f for f in others[0] if all(f in o for o in others[1:])]  # the fields all share
    else:
        label_names = {*labels, "cls"}  # `cls` asks for each source's label, whatever its field's name
        extras = [f for f in config.fields if f not in label_names and not any(f in imgs for imgs in images)]
        for url, m, o in zip(urls, manifests, others):
            lacking = [f for f in extras if f not in o]
            if lacking:
                raise ManifestError(
                    f"{url}: this source has no field {lacking[0]!r} (its fields: {list(m.field_names)}), which "
                    f"fields= asks of every mixed source; leave {lacking} out of fields=, or mix only sources "
                    "that have them")
    projections = []
    for url, m, imgs in zip(urls, manifests, images):
        if config.decode is not None and not imgs:
            raise ManifestError(f"{url}: this source has no image field (its fields: {list(m.field_names)}), but "
                                "images are decoded from every mixed source; mix only image datasets, or read "
                                "raw fields with decode=None")
        wanted = imgs if config.fields is None else tuple(f for f in imgs if f in config.fields)
        own = dataclasses.replace(config, fields=(*wanted, *extras))
        projections.append(fields_to_read(m, own, url)[1])
    ordered = order_image_fields(list(dict.fromkeys(f for imgs in images for f in imgs
                                                    if config.fields is None or f in config.fields)))
    return MixedFields(image_fields=ordered, projections=tuple(projections), label_fields=labels)


def label_space_of(sources: Sequence[Source], opened: OpenSources, config: LoaderConfig) -> LabelSpace:
    """The batches' one label space over these sources (one dataset: a mixture of one), per
    config.label_space; ManifestError when the sources' label names do not fit it."""
    return build_label_space([SourceLabels(url=store.url, given=s.url, store=store, manifest=m)
                              for s, store, m in zip(sources, opened.stores, opened.manifests)], config.label_space)


def mixed_window_samples(opened: OpenSources, config: LoaderConfig) -> int:
    """One shuffle window for the whole mixture: shuffle_window, lowered so a window of the
    mixture's mean sample (each source's mean weighted by its share) fits in shuffle_window_bytes."""
    total = opened.mixture.total
    if config.shuffle_window_bytes is None or total == 0:
        return config.shuffle_window
    mean_bytes = sum(int(c) / total * m.num_bytes / max(1, m.num_samples)
                     for c, m in zip(opened.mixture.counts, opened.manifests))
    return max(1, min(config.shuffle_window, int(config.shuffle_window_bytes // max(1.0, mean_bytes))))
