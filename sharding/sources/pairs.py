"""Image-text pair sources for `shardify write --captions`: a folder of `x.jpg` + `x.txt` (and an
optional `x.json`), img2dataset-style tars (`jpg`, `txt`, `json`, with its parquet of statuses
beside them), or a table with an image column and a caption column.

Every sample leaves here with its caption checked (present, not empty, UTF-8) as the `txt` field;
a sample with several captions (a JSON list, or `txt` plus a `captions` list in its `json`) keeps
the first as `txt` and all of them under `json["captions"]` (dataio/format/captions.py). A bad
caption is a SampleLoadError, so `--on-error skip` counts and names it like a bad image.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from dataio.format.captions import CAPTION_FIELD, CAPTION_LIST_KEY, CaptionsInfo
from dataio.errors import ShardifyError
from dataio.format.manifest import Field
from dataio.storage.store import Store, redact
from sharding.sources.base import (
    IMAGE_EXT_SET,
    TABLE_EXTS,
    RawSample,
    Ref,
    SampleLoadError,
    Source,
    SourceError,
    key_width,
    normalize_ext,
    path_keys,
)
from sharding.sources.by_path import open_source
from sharding.sources.remote import RemoteFiles, is_url, list_sizes

CAPTION_COLUMN_GUESSES = ("caption", "captions", "text", "txt", "prompt")
_FIX = "write a caption for it, or rerun with --on-error skip to leave such samples out"


class CaptionError(SampleLoadError):
    """A sample's caption is missing, empty or not UTF-8."""


def captions_of(value: Any, *, where: str, key: str, name: str) -> list[str]:
    """The captions a field holds (text, UTF-8 bytes, or a JSON list of them); CaptionError if none."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CaptionError(f"{where}: sample {key!r}: caption {name!r} is not UTF-8 text (byte {exc.start}: "
                               f"{bytes(value)[exc.start:exc.start + 4]!r}); re-encode it as UTF-8, or {_FIX}",
                               where=where) from None
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass  # a caption that starts with "[" is still a caption
    items = value if isinstance(value, (list, tuple)) else [value]
    captions = [c.strip() for c in items if isinstance(c, str) and c.strip()]
    if not captions:
        what = "is missing" if value is None else "is empty"
        raise CaptionError(f"{where}: sample {key!r}: caption {name!r} {what}; {_FIX}", where=where)
    return captions


def as_pair(sample: RawSample, caption_key: str) -> RawSample:
    """`sample` with its caption checked and moved to `txt`, alternatives to json["captions"]."""
    captions = captions_of(sample.extras.pop(caption_key, None), where=sample.where, key=sample.key,
                           name=caption_key)
    meta = sample.extras.get("json")
    if isinstance(meta, (bytes, bytearray, memoryview)):  # tars and folders: the json member as bytes
        try:
            doc = json.loads(bytes(meta))
        except (json.JSONDecodeError, UnicodeDecodeError):
            doc = None  # not ours to judge: the json member is written as it came
        more = doc.get(CAPTION_LIST_KEY) if isinstance(doc, dict) else None
        if isinstance(more, list):
            captions += [c.strip() for c in more if isinstance(c, str) and c.strip() and c.strip() not in captions]
        if isinstance(doc, dict) and len(captions) > 1:
            sample.extras["json"] = json.dumps({**doc, CAPTION_LIST_KEY: captions}).encode()
    elif len(captions) > 1:  # a table: its non-bytes values become the json member (base.extras_json)
        sample.extras[CAPTION_LIST_KEY] = captions
    sample.extras[CAPTION_FIELD] = captions[0].encode("utf-8")
    return sample


@dataclass(kw_only=True)
class PairSource(Source):
    """Another source's samples as pairs: `caption_key` (a member or column) becomes `txt`."""

    inner: Source
    caption_key: str = CAPTION_FIELD
    captions: CaptionsInfo = field(default_factory=CaptionsInfo)
    notes: tuple[str, ...] = ()  # for the user: e.g. img2dataset's failed downloads
    tokenizer_file: str = ""  # --tokenizer: stored with the dataset and named by its manifest (writer.py)

    def load(self, refs: Sequence[Ref]) -> Iterator[tuple[Ref, RawSample | Exception]]:
        for ref, loaded in self.inner.load(refs):
            if isinstance(loaded, Exception):
                yield ref, loaded
                continue
            try:
                yield ref, as_pair(loaded, self.caption_key)
            except CaptionError as exc:
                yield ref, exc


def _pair_fields(inner: Source, caption_key: str) -> tuple[Field, ...]:
    kept = tuple(f for f in inner.extra_fields if f.name not in (caption_key, CAPTION_FIELD))
    return (Field(name=CAPTION_FIELD, type="bytes"), *kept)


def wrap_pairs(inner: Source, caption_key: str, notes: Sequence[str] = ()) -> PairSource:
    """`inner` (tars, a table, a pair folder) as a PairSource with the same refs and labels."""
    return PairSource(description=inner.description, refs=inner.refs, label_names=inner.label_names,
                      image_exts=inner.image_exts, extra_fields=_pair_fields(inner, caption_key),
                      has_labels=inner.has_labels, inner=inner, caption_key=caption_key, notes=tuple(notes))


@dataclass(kw_only=True)
class PairFolderSource(Source):
    """A folder of `x.jpg` + `x.txt` (+ `x.json`), in subfolders or not, on local disk or in object storage
    (a URL prefix: read on threads, with the store's retries); refs' loc: (image, txt, json)."""

    root: str
    storage: Any = None

    def load(self, refs: Sequence[Ref]) -> Iterator[tuple[Ref, RawSample | Exception]]:
        files = RemoteFiles(self.storage)
        remote = is_url(self.root)

        def one(ref: Ref) -> RawSample | Exception:
            image_rel, text_rel, json_rel = ref.loc
            path = f"{self.root.rstrip('/')}/{image_rel}" if remote else os.path.join(self.root, image_rel)
            extras: dict[str, Any] = {}
            try:
                image = files.read(path)
                for name, rel in (("txt", text_rel), ("json", json_rel)):
                    if rel is not None:
                        extras[name] = files.read(f"{self.root.rstrip('/')}/{rel}" if remote
                                                  else os.path.join(self.root, rel))
            except OSError as exc:
                return SampleLoadError(f"{path}: cannot read ({exc.strerror or exc})", where=path)
            except ShardifyError as exc:  # object storage, after its retries (credentials redacted)
                return SampleLoadError(str(exc), where=path)
            ext = normalize_ext(os.path.splitext(image_rel)[1])
            return RawSample(ref.key, None, ext, image, extras, path, origin=image_rel)

        if remote:  # object storage: requests in flight on threads (latency bound)
            yield from zip(refs, files.map(one, list(refs)))
            return
        yield from ((ref, one(ref)) for ref in refs)


def open_pair_folder(root: str, *, key: str = "index", storage: Any = None) -> PairFolderSource:
    """Every image below `root` (a local folder or a URL prefix) with the `.txt` (and `.json`) of the
    same name beside it; an image without one is kept, and refused (or skipped) when written, naming it."""
    listed = _listed_remote(root, storage) if is_url(root) else _listed_local(root)  # [(rel, size)], in order
    sizes = dict(listed)
    items: list[tuple[str, str | None, str | None]] = []
    for rel, _ in listed:
        stem, ext = os.path.splitext(rel)
        if os.path.basename(rel).startswith(".") or normalize_ext(ext) not in IMAGE_EXT_SET:
            continue
        items.append((rel, f"{stem}.txt" if f"{stem}.txt" in sizes else None,
                      f"{stem}.json" if f"{stem}.json" in sizes else None))
    if not items:
        raise SourceError(f"{redact(root, storage.secrets if storage else ())}: no images found; a pair folder holds "
                          f"x.jpg with its caption in x.txt (images: {', '.join(sorted(IMAGE_EXT_SET))})")
    width = key_width(len(items))
    keys = path_keys([i[0] for i in items]) if key == "path" else [f"{n:0{width}d}" for n in range(len(items))]
    refs = [Ref(k, None, item, sum(sizes.get(r, 0) for r in item if r), 1 + sum(r is not None for r in item[1:]))
            for k, item in zip(keys, items)]
    exts = tuple(sorted({normalize_ext(os.path.splitext(i[0])[1]) for i in items}))
    fields = (Field(name="json", type="json"),) if any(i[2] for i in items) else ()
    return PairFolderSource(description=redact(root, storage.secrets if storage else ()), refs=refs, label_names=None,
                            image_exts=exts, extra_fields=(Field(name="txt", type="bytes"), *fields),
                            has_labels=False, root=root, storage=storage)


def _listed_local(root: str) -> list[tuple[str, int]]:
    """(path relative to root, size) of every file, a folder's files (sorted) before its sub-folders'."""
    out: list[tuple[str, int]] = []
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel_dir = os.path.relpath(top, root)
        for name in sorted(files):
            rel = name if rel_dir == "." else os.path.join(rel_dir, name)
            out.append((rel, _size(root, rel)))
    return out


def _listed_remote(root: str, storage: Any) -> list[tuple[str, int]]:
    """(key relative to the prefix, size) of every object below it, sorted; one listing, retried."""
    return sorted((rel, size) for rel, size in list_sizes(Store(root, storage), "") if not rel.startswith("."))


def _size(root: str, rel: str) -> int:
    try:
        return os.path.getsize(os.path.join(root, rel))
    except OSError:
        return 0


def open_pairs(src: str, *, caption: str = "", **options: Any) -> PairSource:
    """SRC as image-text pairs: a local folder of images and .txt captions, tars (the `txt` member, or
    `caption`), or a table (the `caption` column, else the first of CAPTION_COLUMN_GUESSES)."""
    path = src.removeprefix("file://")
    is_table = path.lower().endswith(TABLE_EXTS)
    if "://" not in path and os.path.isdir(path) and not _holds_tars_or_tables(path):
        return wrap_pairs(open_pair_folder(path, key=options.get("key", "index")), CAPTION_FIELD)
    if is_url(src) and _is_remote_pair_folder(src, options.get("storage")):
        return wrap_pairs(open_pair_folder(src, key=options.get("key", "index"), storage=options.get("storage")),
                          CAPTION_FIELD)
    inner = open_source(src, **options)
    columns = getattr(inner, "extra_columns", None)
    if columns is not None:  # a table
        caption_key = caption or next((c for g in CAPTION_COLUMN_GUESSES for c in columns if c.lower() == g), "")
        if caption_key not in columns:
            raise SourceError(f"{src}: no caption column {caption_key or CAPTION_COLUMN_GUESSES[0]!r}; its "
                              f"columns are {list(columns)}: name the caption column with --captions COLUMN")
        return wrap_pairs(inner, caption_key)
    caption_key = caption or CAPTION_FIELD
    if not is_table and caption_key not in {f.name for f in inner.extra_fields}:
        raise SourceError(f"{src}: its samples have no {caption_key!r} member (they have "
                          f"{sorted(f.name for f in inner.extra_fields)}); name the caption member with --captions EXT")
    return wrap_pairs(inner, caption_key, notes=img2dataset_notes(inner))


def _is_remote_pair_folder(src: str, storage: Any) -> bool:
    """A URL prefix holding images with their captions and no tars, tables or dataset: a pair folder."""
    if "{" in src or src.endswith(".tar") or src.lower().endswith(TABLE_EXTS):
        return False
    listed = Store(src, storage).list()
    shards = any(n.endswith((".tar", ".tgz")) or ".tar." in n or n.lower().endswith(TABLE_EXTS) or n == "manifest.json"
                 for n in listed)
    return not shards and any(n.endswith(".txt") for n in listed)


def _holds_tars_or_tables(path: str) -> bool:
    return any(e.is_file() and (e.name.endswith(".tar") or ".tar." in e.name or e.name.endswith(".tgz")
                                or (e.name.lower().endswith(TABLE_EXTS) and not _is_status_table(path, e.name)))
               for e in os.scandir(path))


def _is_status_table(path: str, name: str) -> bool:
    """img2dataset's `00000.parquet` beside `00000.tar`: the statuses, not a table of samples."""
    stem = name.rsplit(".", 1)[0]
    return os.path.exists(os.path.join(path, f"{stem}.tar"))


def img2dataset_notes(inner: Source) -> list[str]:
    """img2dataset's parquet of statuses beside each local tar: how many samples failed to download
    (they are not in the tars), with a few of their errors."""
    store, names = getattr(inner, "store", None), getattr(inner, "names", ())
    if store is None or not store.is_local:
        return []
    import pyarrow.parquet as pq

    failed, examples = 0, []
    for name in names:
        status_path = store.path(name.rsplit(".", 1)[0] + ".parquet")
        if not os.path.exists(status_path):
            continue
        table = pq.read_table(status_path)
        if "status" not in table.column_names:
            continue
        errors = table.column("error_message").to_pylist() if "error_message" in table.column_names else None
        for i, status in enumerate(table.column("status").to_pylist()):
            if status != "success":
                failed += 1
                if len(examples) < 3:
                    examples.append(str(errors[i] if errors else status))
    if not failed:
        return []
    return [f"img2dataset's status tables list {failed} sample(s) that failed to download (e.g. {examples}); "
            "they are not in the tars, so not in the dataset"]


def name_tokenizer(source: PairSource, path: str) -> None:
    """The captions' tokenizer for the write to store and name (`--captions --tokenizer FILE`); a file that
    is no tokenizer is refused now, naming it."""
    from dataio.stream.captions import load_caption_tokenizer

    try:
        load_caption_tokenizer(path)
    except ValueError as exc:
        raise SourceError(f"--tokenizer {exc}") from None
    source.tokenizer_file = path


def with_captions(source: Source) -> Any:
    """The CaptionsInfo a write's manifest records: a PairSource's, else None (not a pair dataset)."""
    return source.captions if isinstance(source, PairSource) else None

