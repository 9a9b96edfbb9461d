"""The headline of benchmarks/README.md: from each results file's newest run (the first table of its
kind in the file: every bench script writes the newest run at the top), shardify against the best
peer of that run, as a ratio, with the machine and the date. Read only; no benchmark runs here."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

RATIO_NOTE = ("Ratio: how many times better shardify did than the best peer of the same run, on the same "
              "machine (samples/s or images/s divided; for time to first batch, the peer's seconds over "
              "shardify's). Each figure is the median of repeats in the results file the task links to; "
              "the machine was shared, so compare within a row, not across rows.",
              "Per sample: the same ratio with shardify's raw batches consumed one sample at a time, as the "
              "peers deliver them: walking zero-copy views (`for v in batch['jpg']`), and copying each into "
              "`bytes` (`to_list()`); the ratio column is shardify's packed form (PackedBytes as delivered).")


@dataclass(frozen=True, kw_only=True, slots=True)
class Headline:
    """One task of one run: shardify's figure and the best peer's, in one unit."""
    task: str
    file: str
    peer: str
    peer_value: float
    ours: float
    unit: str  # "samples/s", "images/s" (higher is better) or "s" (lower is better)
    machine: str
    date: str
    per_sample: tuple[float, float] | None = None  # shardify's rate walking views, copying to bytes

    @property
    def ratio(self) -> float:
        return self.peer_value / self.ours if self.unit == "s" else self.ours / self.peer_value


HEADER = ("| task | best peer | peer | shardify | ratio | per sample: views, bytes | machine | date |",
          "|---|---|---:|---:|---:|---:|---|---|")


def headline_row(h: Headline) -> str:
    """The markdown row of one headline."""
    per_sample = "-" if h.per_sample is None else (
        f"**{h.per_sample[0] / h.peer_value:.2f}x**, {h.per_sample[1] / h.peer_value:.2f}x")
    return (f"| [{h.task}]({h.file}) | {h.peer} | {_value(h.peer_value, h.unit)} | {_value(h.ours, h.unit)} "
            f"| **{h.ratio:.2f}x** | {per_sample} | {h.machine} | {h.date} |")


def _value(x: float, unit: str) -> str:
    return f"{x:.2f} s" if unit == "s" else f"{x:,.0f} {unit}"


# --- reading a results file -----------------------------------------------------------------------

Table = list[dict[str, str]]


def tables(text: str) -> list[tuple[str, Table]]:
    """Every markdown table of `text` as (the heading above it, its rows as {column: cell})."""
    out, heading, lines = [], "", text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|$", lines[i + 1]):
            header = _cells(line)
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(dict(zip(header, _cells(lines[i]))))
                i += 1
            out.append((heading, rows))
            continue
        i += 1
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def number(cell: str) -> float:
    """The first number of a cell ("75,322", "0.08", "1.35x")."""
    m = re.search(r"-?\d[\d,]*(?:\.\d+)?", cell)
    if m is None:
        raise ValueError(f"no number in table cell {cell!r}")
    return float(m.group().replace(",", ""))


def first_table(text: str, *columns: str) -> tuple[str, Table]:
    """The first table having all `columns` (the newest run's)."""
    for heading, rows in tables(text):
        if rows and all(c in rows[0] for c in columns):
            return heading, rows
    raise ValueError(f"no table with columns {columns}")


def title_of(text: str) -> str:
    """The file's title, without the work-item references bench scripts put in some."""
    title = next((ln[2:].strip() for ln in text.splitlines() if ln.startswith("# ")), "untitled")
    return re.sub(r"\s*\(issue [^)]*\)", "", title)


def machine_of(text: str) -> str:
    """The first two parts of the file's `Machine:` line ("AMD EPYC, 2 cores"); "-" when it has none."""
    m = re.search(r"\bMachine: (.*)$", text, re.M)
    if m is None:
        return "-"
    brief = re.sub(r'\s*\([^)]*\)|\s*"[^"]*"', "", m.group(1))  # "Intel(R) Xeon(R)", quoted models
    return ", ".join(brief.split(", ")[:2]).rstrip(".;")


def date_of(path: Path) -> str:
    """The newest run's date: the first date in the file (each file starts with its newest run), else
    the date git last committed the file."""
    m = re.search(r"\b(20\d\d-\d\d-\d\d)\b", path.read_text())
    if m:
        return m.group(1)
    got = subprocess.run(["git", "log", "-1", "--format=%cs", "--", path.name], cwd=path.parent,
                         capture_output=True, text=True, check=False).stdout.strip()
    return got or "not stated"


# --- the headline of each results file --------------------------------------------------------------

def _best(rows: Table, pick: Callable[[dict[str, str]], bool], column: str, *, lower: bool = False
          ) -> tuple[str, float]:
    """(name, value) of the best row `pick` accepts, by `column`."""
    chosen = [(r.get("loader") or r.get("what") or r.get("writer") or r.get("path", ""), number(r[column]))
              for r in rows if pick(r)]
    if not chosen:
        raise ValueError(f"no peer row for column {column!r}")
    return min(chosen, key=lambda c: c[1]) if lower else max(chosen, key=lambda c: c[1])


def _loader(text: str, file: str) -> list[Headline]:
    _, rows = first_table(text, "loader", "task", "source", "later epochs samples/s")
    out = []
    for source, task in (("local", "Read raw bytes, local tar, 2 workers"),
                         ("local, 0 workers", "Read raw bytes, local tar, no workers")):
        ours = [r for r in rows if r["loader"] == "shardify" and r["source"] == source and r["task"] == "raw"]
        peers = [r for r in rows if r["source"] == source and r["task"] == "raw"
                 and r["loader"] not in ("shardify", "page cache")]
        if ours and peers:
            peer, value = _best(peers, lambda r: True, "later epochs samples/s")
            h = _h(text, file, task, peer, value, number(ours[0]["later epochs samples/s"]), "samples/s")
            forms = [ours[0].get(f"{form} samples/s", "-") for form in ("views", "to_list")]
            if "-" not in forms:
                h = replace(h, per_sample=(number(forms[0]), number(forms[1])))
            out.append(h)
    return out


def _first(text: str, file: str) -> list[Headline]:
    _, rows = first_table(text, "loader", "batch", "first batch (s), median")
    out = []
    for batch in dict.fromkeys(r["batch"] for r in rows):
        ours = [r for r in rows if r["loader"] == "shardify" and r["batch"] == batch]
        peer, value = _best(rows, lambda r, b=batch: r["batch"] == b and not r["loader"].startswith("shardify"),
                            "first batch (s), median", lower=True)
        out.append(_h(text, file, f"Time to first batch, decoded, batch {batch}", peer, value,
                      number(ours[0]["first batch (s), median"]), "s"))
    return out


def _s3(text: str, file: str) -> list[Headline]:
    _, rows = first_table(text, "shards", "what", "later epochs samples/s")
    out, size = [], ""
    for r in rows:
        size = r["shards"].split(" ")[0] or size
        r["size"] = size
    for size in dict.fromkeys(r["size"] for r in rows):
        ours = [r for r in rows if r["size"] == size and r["what"].startswith("shardify")]
        peer, value = _best(rows, lambda r, s=size: r["size"] == s and r["what"].startswith("webdataset"),
                            "later epochs samples/s")
        out.append(_h(text, file, f"Read raw bytes from S3, {size} shards, 2 workers", peer.split(" RAW")[0],
                      value, number(ours[0]["later epochs samples/s"]), "samples/s"))
    return out


def _write(text: str, file: str) -> list[Headline]:
    _, rows = first_table(text, "writer", "samples/s")
    ours = [r for r in rows if "(default), 2 workers" in r["writer"] and "tar" in r["writer"]]
    peer, value = _best(rows, lambda r: not r["writer"].startswith("shardify"), "samples/s")
    return [_h(text, file, "Write tar shards from an image folder (default checks)", peer, value,
               number(ours[0]["samples/s"]), "samples/s")]


def _decode(text: str, file: str) -> list[Headline]:
    out = []
    for heading, rows in tables(text):
        if not rows or "images/s" not in rows[0]:
            continue
        ours = [number(r["images/s"]) for r in rows if "decode+RRC" in r["path"] and ": ours" in r["path"]]
        peer, value = _best(rows, lambda r: "webdataset-style" in r["path"], "images/s")
        size = heading.split(" ")[0]
        out.append(_h(text, file, f"Decode + random crop + flip, one core, {size} JPEGs", "webdataset-style (PIL)",
                      value, max(ours), "images/s"))
    return out


def _dali(text: str, file: str) -> list[Headline]:
    _, rows = first_table(text, "mode", "threads", "CpuDecoder img/s", "DALI (CPU) img/s")
    row = max((r for r in rows if r["mode"].startswith("train")), key=lambda r: number(r["threads"]))
    return [_h(text, file, f"Decode + random crop + flip on CPU, {row['threads']} threads", "DALI (CPU operators)",
               number(row["DALI (CPU) img/s"]), number(row["CpuDecoder img/s"]), "images/s")]


def _h(text: str, file: str, task: str, peer: str, value: float, ours: float, unit: str) -> Headline:
    return Headline(task=task, file=file, peer=peer, peer_value=value, ours=ours, unit=unit,
                    machine=machine_of(text), date="")


# results file name (results_NAME.md) -> its headlines; files without a peer are linked below the table.
HEADLINES: dict[str, Callable[[Path], list[Headline]]] = {}


def _register(name: str, read: Callable[[str, str], list[Headline]]) -> None:
    def headlines(path: Path) -> list[Headline]:
        date = date_of(path)
        return [replace(h, date=date) for h in read(path.read_text(), path.name)]
    HEADLINES[name] = headlines


for _name, _read in (("loader", _loader), ("first", _first), ("s3", _s3), ("write", _write),
                     ("decode", _decode), ("dali", _dali)):
    _register(_name, _read)
