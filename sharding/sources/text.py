"""A text source: documents from JSON Lines (.jsonl, .ndjson, also .gz), Parquet with a text column
(a Hugging Face `datasets` export's data/*.parquet included), or .txt / .md files (one document each);
a file or a folder / prefix of them, local or in object storage (through the Store).

The parent scans every file once: each document's location (file, line or row, byte span), its
UTF-8 checked (bad bytes replaced and counted, or refused naming the file and line), empty
documents dropped unless kept, exact duplicates dropped by an xxh3-128 of their text when asked.
Workers read back only their shard's documents (one ranged read per JSON Lines file).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from dataio.errors import ShardifyError
from dataio.storage.store import Store, redact
from sharding.sources.base import RawSample, Ref, SampleLoadError, Source, SourceError, key_width

JSONL_EXTS = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".json.gz")
PARQUET_EXTS = (".parquet", ".pq")
PLAIN_EXTS = (".txt", ".md")
TEXT_EXTS = JSONL_EXTS + PARQUET_EXTS + PLAIN_EXTS
BAD_UTF8_MODES = ("replace", "refuse")


@dataclass(frozen=True, kw_only=True, slots=True)
class TextScan:
    """How the documents of a text source are picked: the field, bad UTF-8, empties, duplicates."""

    text_field: str = "text"
    on_bad_utf8: str = "replace"
    keep_empty: bool = False
    dedup: bool = False

    def __post_init__(self) -> None:
        if self.on_bad_utf8 not in BAD_UTF8_MODES:
            raise ValueError(f"on_bad_utf8 {self.on_bad_utf8!r}: choose one of {BAD_UTF8_MODES}")
        if not self.text_field:
            raise ValueError("the text field must be a non-empty name")


def is_text_path(name: str) -> bool:
    """A text file by its extension, outside hidden files and folders (.git/, .cache/)."""
    return name.lower().endswith(TEXT_EXTS) and not any(p.startswith(".") for p in name.split("/") if p)


def _kind(name: str) -> str:
    lower = name.lower()
    return "jsonl" if lower.endswith(JSONL_EXTS) else "parquet" if lower.endswith(PARQUET_EXTS) else "plain"


def _at(rel: str, number: int) -> str:
    """" line N" (JSON Lines, from 1), " row N" (Parquet, from 0) or "" (a whole-file document)."""
    kind = _kind(rel)
    return f" line {number}" if kind == "jsonl" else f" row {number}" if kind == "parquet" else ""


def _decode(raw: bytes, scan: TextScan, where: str) -> tuple[str, bool]:
    """(text, had bad bytes); SourceError with --on-bad-utf8 refuse."""
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError as exc:
        if scan.on_bad_utf8 == "refuse":
            raise SourceError(f"{where}: not valid UTF-8 (byte {exc.start}: {raw[exc.start:exc.start + 4]!r}); fix "
                              "the file, or pass --on-bad-utf8 replace to replace bad bytes with U+FFFD") from None
        return raw.decode("utf-8", "replace"), True


def _clean(text: str, scan: TextScan, where: str) -> tuple[str, bool]:
    """A JSON string may hold lone surrogates (\\ud800) that no UTF-8 holds: treated as bad bytes."""
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        if scan.on_bad_utf8 == "refuse":
            raise SourceError(f"{where}: the text holds a lone surrogate, not valid UTF-8; fix it, or pass "
                              "--on-bad-utf8 replace") from None
        return text.encode("utf-8", "replace").decode("utf-8"), True


def _field_of(doc: Any, scan: TextScan, where: str) -> str:
    value = doc.get(scan.text_field) if isinstance(doc, dict) else None
    if not isinstance(value, str):
        got = "no such field" if not isinstance(doc, dict) or scan.text_field not in doc else \
            f"a {type(value).__name__}, not a string"
        fields = sorted(doc)[:10] if isinstance(doc, dict) else type(doc).__name__
        raise SourceError(f"{where}: text field {scan.text_field!r}: {got} (fields: {fields}); pass the field that "
                          "holds the text with --text-field")
    return value


def _json_line(raw: bytes, scan: TextScan, where: str) -> tuple[str, bool]:
    line, bad = _decode(raw, scan, where)
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{where}: not a JSON object ({exc}); each line of a JSON Lines file is one document "
                          "object") from None
    text, bad_surrogate = _clean(_field_of(doc, scan, where), scan, where)
    return text, bad or bad_surrogate


def _read_file(store: Store, rel: str) -> bytes:
    data = bytes(store.read(rel))
    return gzip.decompress(data) if rel.lower().endswith(".gz") else data


def _lines(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(line number from 1, start, end) of each non-blank line (end excludes the newline)."""
    start = 0
    for number, line in enumerate(data.split(b"\n"), 1):
        end = start + len(line)
        if line.strip():
            yield number, start, end
        start = end + 1


def _parquet_file(store: Store, rel: str) -> Any:
    """A ParquetFile: a local one memory-mapped (only the pages read are touched), a remote one in memory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if store.is_local:
            return pq.ParquetFile(store.path(rel), memory_map=True)
        return pq.ParquetFile(pa.BufferReader(bytes(store.read(rel))))
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...
        raise SourceError(f"{store.url_of(rel)}: cannot read this Parquet file ({type(exc).__name__}: {exc})") from None


def _parquet_texts(pf: Any, scan: TextScan, where: str, rows: Sequence[int] | None = None) -> dict[int, Any]:
    """Row -> text column value, of every row, or of the row groups holding `rows`."""
    import numpy as np

    names = pf.schema_arrow.names
    if scan.text_field not in names:
        raise SourceError(f"{where}: no column {scan.text_field!r}; its columns are {names}; pass the column that "
                          "holds the text with --text-field")
    sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    groups = range(len(sizes)) if rows is None else \
        sorted(set((np.searchsorted(starts, np.asarray(rows), side="right") - 1).tolist()))
    out: dict[int, Any] = {}
    for g in groups:
        values = pf.read_row_group(g, columns=[scan.text_field], use_threads=False).column(0).to_pylist()
        out.update(zip(range(int(starts[g]), int(starts[g]) + len(values)), values))
    return out


def _parquet_row(value: Any, scan: TextScan, where: str) -> tuple[str, bool]:
    if isinstance(value, bytes):
        return _decode(value, scan, where)
    if not isinstance(value, str):
        raise SourceError(f"{where}: column {scan.text_field!r} is {'empty (null)' if value is None else type(value)}"
                          ", not text; fix the row, or pass the column that holds the text with --text-field")
    return _clean(value, scan, where)


@dataclass(kw_only=True)
class TextSource(Source):
    """Documents of text files under `store`; a Ref's loc is (file number, line or row, start, end)."""

    store: Store
    files: tuple[str, ...]
    scan: TextScan
    counts: dict[str, int] = field(default_factory=dict)  # documents, duplicate, empty, bad_utf8
    bad_utf8_at: list[str] = field(default_factory=list)  # where each document with bad UTF-8 is (file, line)

    def where(self, loc: tuple[int, int, int, int]) -> str:
        """A document's provenance: its file relative to SRC, and its line or row."""
        return self.files[loc[0]] + _at(self.files[loc[0]], loc[1])

    def _text(self, loc: tuple[int, int, int, int], span: Any) -> str:
        index, number, start, end = loc
        rel = self.files[index]
        where = self.store.url_of(rel) + _at(rel, number)
        if _kind(rel) == "parquet":  # span: the rows of its row groups this shard needs
            return _parquet_row(span[number], self.scan, where)[0]
        base, data = span
        raw = data[start - base:end - base]
        if _kind(rel) == "jsonl":
            return _json_line(raw, self.scan, where)[0]
        return _decode(raw, self.scan, where)[0]

    def _span(self, refs: Sequence[Ref]) -> dict[int, Any]:
        """Per JSON Lines / plain file, the bytes spanning its documents among `refs` (one read each);
        per Parquet file, the text of the row groups holding them (row -> value)."""
        spans: dict[int, list[int]] = {}
        rows: dict[int, list[int]] = {}
        for ref in refs:
            index, number, start, end = ref.loc
            lo, hi = spans.get(index, [start, end])
            spans[index] = [min(lo, start), max(hi, end)]
            rows.setdefault(index, []).append(number)
        out = {}
        for index, (lo, hi) in spans.items():
            rel = self.files[index]
            if _kind(rel) == "parquet":
                out[index] = _parquet_texts(_parquet_file(self.store, rel), self.scan, self.store.url_of(rel),
                                            rows[index])
                continue
            if rel.lower().endswith(".gz"):  # no ranged reads into a gzip stream: the whole file
                out[index] = (0, _read_file(self.store, rel))
            else:
                out[index] = (lo, bytes(self.store.read(rel, lo, hi)) if hi > lo else b"")
        return out

    def load(self, refs: Sequence[Ref]) -> Iterator[tuple[Ref, RawSample | Exception]]:
        spans = self._span(refs)
        for ref in refs:
            where = self.where(ref.loc)
            try:
                text = self._text(ref.loc, spans.get(ref.loc[0], (0, b"")))
            except (ShardifyError, OSError) as exc:
                yield ref, SampleLoadError(redact(str(exc)), where=self.store.url_of(self.files[ref.loc[0]]))
                continue
            if text.isspace():  # a whitespace-only document (--keep-empty) is kept as just its EOS
                text = ""
            yield ref, RawSample(ref.key, None, None, None, {"text": text}, self.store.url_of(self.files[ref.loc[0]]),
                                 origin=where)


def _file_docs(store: Store, rel: str, scan: TextScan) -> Iterator[tuple[tuple[int, int, int], str, bool]]:
    """((line or row, start, end), text, had bad UTF-8) of every document of one file, in order."""
    url, kind = store.url_of(rel), _kind(rel)
    if kind == "parquet":
        for row, value in sorted(_parquet_texts(_parquet_file(store, rel), scan, url).items()):
            yield (row, 0, 0), *_parquet_row(value, scan, f"{url} row {row}")
        return
    data = _read_file(store, rel)
    if kind == "plain":
        nul = data.find(b"\0")
        if nul >= 0:  # no text file holds NUL: a binary file named .txt / .md
            raise SourceError(f"{url}: holds NUL bytes (the first at byte {nul}): a binary file, not text; move it "
                              "out of the source folder, or give the text files one by one")
        yield (0, 0, len(data)), *_decode(data, scan, url)
        return
    for number, start, end in _lines(data):
        yield (number, start, end), *_json_line(data[start:end], scan, f"{url} line {number}")


def _listing(src: str, storage: Any) -> tuple[Store, list[str]]:
    """The Store holding SRC and the text files to read (SRC itself, or those under it, sorted)."""
    shown = redact(src, storage.secrets if storage else ())
    if is_text_path(src):
        parent, _, name = src.rstrip("/").rpartition("/")
        store = Store(parent or ".", storage)
        if not store.exists(name):
            raise SourceError(f"{shown}: the text source does not exist")
        return store, [name]
    store = Store(src, storage)
    files = sorted(n for n in store.list() if is_text_path(n))
    structured = [n for n in files if _kind(n) != "plain"]
    if structured:  # JSON Lines / Parquet documents: a README.md beside them (a dataset card) is no document
        files = structured
    if not files:
        raise SourceError(f"{shown}: no text files here ({', '.join(TEXT_EXTS)}); give a JSON Lines or Parquet file, "
                          "or a folder of them or of .txt / .md files")
    return store, files


def open_text(src: str, *, scan: TextScan, storage: Any = None) -> TextSource:
    """Scan SRC (a text file, or a folder / prefix of them) into one Ref per kept document."""
    store, files = _listing(src, storage)
    locs: list[tuple[int, int, int, int]] = []
    sizes: list[int] = []
    seen: set[int] = set()
    counts = {"documents": 0, "duplicate": 0, "empty": 0, "bad_utf8": 0}
    bad_at: list[str] = []
    for index, rel in enumerate(files):
        for (number, start, end), text, bad in _file_docs(store, rel, scan):
            counts["bad_utf8"] += bad
            if bad:
                bad_at.append(rel + _at(rel, number))
            if not scan.keep_empty and not text.strip():
                counts["empty"] += 1
                continue
            data = text.encode("utf-8")
            if scan.dedup:
                digest = xxhash.xxh3_128_intdigest(data)
                if digest in seen:
                    counts["duplicate"] += 1
                    continue
                seen.add(digest)
            locs.append((index, number, start, end))
            sizes.append(len(data))
    counts["documents"] = len(locs)
    shown = redact(src, storage.secrets if storage else ())
    if not locs:
        raise SourceError(f"{shown}: no documents left to write ({counts}); check --text-field, or pass --keep-empty")
    width = key_width(len(locs))
    refs = [Ref(f"{i:0{width}d}", None, loc, size, 0) for i, (loc, size) in enumerate(zip(locs, sizes))]
    return TextSource(description=shown, refs=refs, label_names=None, image_exts=(), has_labels=False,
                      store=store, files=tuple(files), scan=scan, counts=counts, bad_utf8_at=bad_at)


def sample_texts(source: TextSource, num: int = 256) -> list[str]:
    """The first `num` documents' texts (the parent's sample for the bytes-per-token estimate)."""
    return [s.extras["text"] for _, s in source.load(source.refs[:num]) if isinstance(s, RawSample)]
