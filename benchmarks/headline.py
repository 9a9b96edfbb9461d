"""The headline of benchmarks/README.md: from each results file's newest run (the first table of its
kind in the file: every bench script writes the newest run at the top), shardify against the best
peer of that run, as a ratio, with the machine, its load and the date. Read only; no benchmark runs here."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

RATIO_NOTE = ("Ratio: how many times better shardify did than the best peer of the same run, on the same "
              "machine (rates divided: samples/s, images per CPU-second, tokens/s, MB/s; for time to first "
              "batch, the peer's seconds over shardify's). Each figure is the median of repeats in the results "
              "file the task links to; the machine was shared, so compare within a row, not across rows.",
              "Best peer: the fastest peer that run measured, named as it ran (where a peer was not run, the "
              "row says so). The GCS and Azure rows ran on local emulators, not the clouds. np.memmap "
              "get_batch draws random windows, not every token once per epoch: its row is a bound, not a peer "
              "with the same guarantee.",
              "Per sample: the same ratio with shardify's raw batches consumed one sample at a time, as the "
              "peers deliver them: walking zero-copy views (`for v in batch['jpg']`), and copying each into "
              "`bytes` (`to_list()`); the ratio column is shardify's packed form (PackedBytes as delivered).",
              "Load: the machine's load average as the results file states it for that run (at its start where "
              "it gives several); **loaded** marks a run whose load exceeded the machine's cores, i.e. other "
              "work shared the CPUs and single figures move with it (the ratio, from one interleaved run, "
              "moves less); \"-\": the file states none.")


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
    load: str = "-"  # the run's load average as its results file states it, "**loaded**" marked

    @property
    def ratio(self) -> float:
        return self.peer_value / self.ours if self.unit == "s" else self.ours / self.peer_value


HEADER = ("| task | best peer | peer | shardify | ratio | per sample: views, bytes | machine | load | date |",
          "|---|---|---:|---:|---:|---:|---|---|---|")


def headline_row(h: Headline) -> str:
    """The markdown row of one headline."""
    per_sample = "-" if h.per_sample is None else (
        f"**{h.per_sample[0] / h.peer_value:.2f}x**, {h.per_sample[1] / h.peer_value:.2f}x")
    return (f"| [{h.task}]({h.file}) | {h.peer} | {_value(h.peer_value, h.unit)} | {_value(h.ours, h.unit)} "
            f"| **{h.ratio:.2f}x** | {per_sample} | {h.machine} | {h.load} | {h.date} |")


def _value(x: float, unit: str) -> str:
    if unit == "s":
        return f"{x:.2f} s"
    return f"{x:,.1f} {unit}" if x < 100 and unit.startswith("M ") else f"{x:,.0f} {unit}"


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
    return re.sub(r"\s*\(issues? [^)]*\)", "", title)


def machine_of(text: str) -> str:
    """The first two parts of the file's `Machine:` line ("AMD EPYC, 2 cores"); "-" when it has none."""
    m = re.search(r"\bMachine: (.*)$", text, re.M)
    if m is None:
        return "-"
    brief = re.sub(r'\s*\([^)]*\)|\s*"[^"]*"', "", m.group(1))  # "Intel(R) Xeon(R)", quoted models
    return ", ".join(brief.split(", ")[:2]).rstrip(".;")


LOAD = re.compile(r"\b[Ll]oad average(?: at the (?:start|end)(?: of the run)?| when the benchmark started)?:? "
                  r"(\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?)")


def load_of(text: str) -> str:
    """The newest run's load average as the file states it ("11.4", "8-16"; the first figure: the 1-minute
    load, at the start where several are given), marked **loaded** above the machine's cores; "-" if none."""
    m = LOAD.search(text)
    if m is None:
        return "-"
    cores = re.search(r"\b(\d+) (?:cores|vCPUs)\b|\bnproc (\d+)", text)
    num_cores = int(next(g for g in cores.groups() if g)) if cores else 2
    figure = m.group(1)
    return f"{figure} **loaded**" if number(figure) > num_cores else figure


def newest_section(text: str) -> str:
    """The file's first run: its text up to the second top-level (`# `) heading, for files that stack
    whole runs, each under its own title, newest first."""
    starts = [m.start() for m in re.finditer(r"^# ", text, re.M)]
    return text[:starts[1]] if len(starts) > 1 else text


def date_of(path: Path) -> str:
    """The newest run's date: its "Run DATE" line, else the first date in the file (each file starts with its
    newest run), else the date git last committed the file."""
    text = path.read_text()
    m = (re.search(r"^Run (20\d\d-\d\d-\d\d)\b", newest_section(text), re.M)
         or re.search(r"\b(20\d\d-\d\d-\d\d)\b", text))
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


def _loader(text: str, file: str, samples: str = "") -> list[Headline]:
    _, rows = first_table(text, "loader", "task", "source", "later epochs samples/s")
    out = []
    for source, task in (("local", f"Read raw bytes, local tar, 2 workers{samples}"),
                         ("local, 0 workers", f"Read raw bytes, local tar, no workers{samples}")):
        ours = [r for r in rows if r["loader"] == "shardify" and r["source"] == source and r["task"] == "raw"]
        peers = [r for r in rows if r["source"] == source and r["task"] == "raw"
                 and r["loader"] not in ("shardify", "page cache")]
        if ours and peers:
            peer, value = _best(peers, lambda r: True, "later epochs samples/s")
            h = _h(text, file, task, _peer(peer), value, number(ours[0]["later epochs samples/s"]), "samples/s")
            forms = [ours[0].get(f"{form} samples/s", "-") for form in ("views", "to_list")]
            if "-" not in forms:
                h = replace(h, per_sample=(number(forms[0]), number(forms[1])))
            out.append(h)
    return out


def _loader_2k(text: str, file: str) -> list[Headline]:
    return _loader(text, file, samples=", smaller samples (2k set)")


def _s3_start(text: str, file: str) -> list[Headline]:
    """Time to the first RAW batch from S3 (SeaweedFS on the same machine), shardify against webdataset."""
    _, rows = first_table(text, "shards", "workers", "shardify (s)", "webdataset (s)")
    workers = {"0": "no workers", "2": "2 workers"}
    return [_h(text, file, f"Time to first batch from S3, raw bytes, {r['shards']} shards, "
               f"{workers.get(r['workers'], r['workers'] + ' workers')}", "webdataset", number(r["webdataset (s)"]),
               number(r["shardify (s)"]), "s") for r in rows]


def _first(text: str, file: str) -> list[Headline]:
    _, rows = first_table(text, "loader", "batch", "first batch (s), median")
    out = []
    for batch in dict.fromkeys(r["batch"] for r in rows):
        ours = [r for r in rows if r["loader"] == "shardify" and r["batch"] == batch]
        peer, value = _best(rows, lambda r, b=batch: r["batch"] == b and not r["loader"].startswith("shardify"),
                            "first batch (s), median", lower=True)
        out.append(_h(text, file, f"Time to first batch, decoded, batch {batch}", _peer(peer), value,
                      number(ours[0]["first batch (s), median"]), "s"))
    return out


def _s3(text: str, file: str) -> list[Headline]:
    """RAW from S3 at each shard size, per worker count (one table each, or one 2-worker table in
    runs before the 0-worker rows), with shardify's per-sample forms where the run measured them."""
    section = newest_section(text)
    out = []
    for _, rows in tables(section):
        if not rows or not all(c in rows[0] for c in ("shards", "what", "later epochs samples/s")):
            continue
        size = ""
        for r in rows:
            size = r["shards"].split(" ")[0] or size
            r["size"] = size
        workers = next((m.group(1) for r in rows if (m := re.search(r"(\d+) workers?", r["what"]))), "2")
        for size in dict.fromkeys(r["size"] for r in rows):
            ours = [r for r in rows if r["size"] == size and r["what"].startswith("shardify")]
            # The best peer of the row's shard size (webdataset, s3torchconnector, obstore), not a ceiling.
            peer, value = _best(rows, lambda r, s=size: r["size"] == s and " RAW" in r["what"]
                                and not r["what"].startswith("shardify"), "later epochs samples/s")
            label = "no workers" if workers == "0" else f"{workers} workers"
            h = _h(text, file, f"Read raw bytes from S3, {size} shards, {label}", peer.split(" RAW")[0],
                   value, number(ours[0]["later epochs samples/s"]), "samples/s")
            forms = [ours[0].get(f"{form} samples/s", "-") for form in ("views", "to_list")]
            if "-" not in forms:
                h = replace(h, per_sample=(number(forms[0]), number(forms[1])))
            out.append(h)
    return out


def _s3_https(text: str, file: str) -> list[Headline]:
    """bench_s3 --https: the same rows over TLS."""
    return [replace(h, task=h.task.replace("from S3", "from S3 over HTTPS")) for h in _s3(text, file)]


def _write(text: str, file: str) -> list[Headline]:
    _, rows = first_table(text, "writer", "samples/s")
    ours = [r for r in rows if "(default), 2 workers" in r["writer"] and "tar" in r["writer"]]
    peer, value = _best(rows, lambda r: not r["writer"].startswith("shardify"), "samples/s")
    return [_h(text, file, "Write tar shards from an image folder (default checks)", peer, value,
               number(ours[0]["samples/s"]), "samples/s")]


def _decode(text: str, file: str) -> list[Headline]:
    """The newest run of results_decode.md: bench_region's (region decode) or bench_decode's."""
    section = newest_section(text)
    if any(rows and "images per CPU-s" in rows[0] for _, rows in tables(section)):
        return _region(section, file)
    out = []
    for heading, rows in tables(section):
        if not rows or "images/s" not in rows[0]:
            continue
        ours = [number(r["images/s"]) for r in rows if "decode+RRC" in r["path"] and ": ours" in r["path"]]
        peer, value = _best(rows, lambda r: "webdataset-style" in r["path"], "images/s")
        size = heading.split(" ")[0]
        out.append(_h(section, file, f"Decode + random crop + flip, one core, {size} JPEGs", "webdataset-style (PIL)",
                      value, max(ours), "images/s"))
    return out


def _region(section: str, file: str) -> list[Headline]:
    """bench_region's run: region decode against the best other RRC path per one-core table (PIL, webdataset-style,
    DALI; not today's code, which it replaces), and the loader's DECODE row against the best peer loader."""
    out = []
    for heading, rows in tables(section):
        if rows and "images per CPU-s" in rows[0] and heading.startswith("One core"):
            ours = [r for r in rows if r["path"] == "RRC: region decode"]
            peer, value = _best(rows, lambda r: r["path"].startswith("RRC:") and "today" not in r["path"]
                                and "region decode" not in r["path"], "images per CPU-s")
            task = f"Decode + random crop + flip, one core, {heading[len('One core, '):]}"
            out.append(_h(section, file, task, peer.removeprefix("RRC: "), value,
                          number(ours[0]["images per CPU-s"]), "images per CPU-s"))
    _, rows = first_table(section, "loader", "samples/s (median)")
    ours = [r for r in rows if r["loader"] == "shardify, region decode"]
    peer, value = _best(rows, lambda r: not r["loader"].startswith("shardify"), "samples/s (median)")
    out.append(_h(section, file, "Read + decode + random crop + flip, local tar, 2 workers (region decode)",
                  _peer(peer), value, number(ours[0]["samples/s (median)"]), "samples/s"))
    return out


def _tokens(text: str, file: str) -> list[Headline]:
    """Input-id batches per seq_len: with 2 workers and with none against the best exactly-once peer of the
    same setting, and with 2 workers against np.memmap get_batch (random windows: not exactly once)."""
    _, rows = first_table(text, "seq_len", "workers", "loader", "tokens/s, median")
    out = []
    for seq_len in dict.fromkeys(r["seq_len"] for r in rows):
        def ours(workers: str, s: str = seq_len) -> float:
            got = [r for r in rows if r["seq_len"] == s and r["workers"] == workers
                   and r["loader"] == "shardify, input_ids only"]
            return number(got[0]["tokens/s, median"])
        for workers, label in (("2", "2 workers"), ("0", "no workers")):
            peer, value = _best(rows, lambda r, w=workers, s=seq_len: r["seq_len"] == s and r["workers"] == w
                                and not r["loader"].startswith(("shardify", "np.memmap")), "tokens/s, median")
            out.append(_h(text, file, f"Token batches (input ids), seq_len {seq_len}, {label}", peer, value,
                          ours(workers), "M tokens/s"))
        peer, value = _best(rows, lambda r, s=seq_len: r["seq_len"] == s and r["loader"].startswith("np.memmap"),
                            "tokens/s, median")
        out.append(_h(text, file, f"Token batches (input ids), seq_len {seq_len}, 2 workers, vs not exactly once",
                      peer, value, ours("2"), "M tokens/s"))
    return out


def _clouds(text: str, file: str) -> list[Headline]:
    """RAW over the same tar shards on each local emulator (fake-gcs-server, Azurite) against webdataset."""
    _, rows = first_table(text, "store", "loader", "MB/s")
    names = {"gcs": "GCS (fake-gcs-server emulator)", "azure": "Azure Blob (Azurite emulator)"}
    out = []
    for store in dict.fromkeys(r["store"] for r in rows):
        ours = [r for r in rows if r["store"] == store and r["loader"] == "shardify RAW"]
        peer, value = _best(rows, lambda r, s=store: r["store"] == s and r["loader"] == "webdataset", "MB/s")
        out.append(_h(text, file, f"Read raw bytes from {names.get(store, store)}, 2 workers", peer, value,
                      number(ours[0]["MB/s"]), "MB/s"))
    # The file states this run's load only beside the earlier run's ("at load average 11-15 (this one: 5-10)").
    this = re.search(r"\(this one: (\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?)\)", text)
    return [replace(h, load=load_of(f"Load average {this.group(1)} on 2 cores")) for h in out] if this else out


def _dali(text: str, file: str) -> list[Headline]:
    _, rows = first_table(text, "mode", "threads", "CpuDecoder img/s", "DALI (CPU) img/s")
    row = max((r for r in rows if r["mode"].startswith("train")), key=lambda r: number(r["threads"]))
    return [_h(text, file, f"Decode + random crop + flip on CPU, {row['threads']} threads", "DALI (CPU operators)",
               number(row["DALI (CPU) img/s"]), number(row["CpuDecoder img/s"]), "images/s")]


def _pairs(text: str, file: str) -> list[Headline]:
    _, rows = first_table(text, "loader", "pairs/s, median")
    ours = next(number(r["pairs/s, median"]) for r in rows if r["loader"].startswith("shardify"))
    peer, value = _best(rows, lambda r: not r["loader"].startswith("shardify"), "pairs/s, median")
    return [_h(text, file, "Image-text pairs: images decoded, captions tokenized, 2 workers",
               peer.split(" ")[0], value, ours, "pairs/s")]


# The loader benchmark's peer names, as the headline shows them ("plain" stands in when ImageFolder's
# venv was not built: say what it is, so the row cannot be read as ImageFolder's).
PEER_NAMES = {"plain": "plain file-per-sample DataLoader (ImageFolder not run)", "imagefolder": "ImageFolder",
              "litdata": "LitData", "streaming": "MosaicML Streaming"}


def _peer(name: str) -> str:
    return PEER_NAMES.get(name, name)


def _h(text: str, file: str, task: str, peer: str, value: float, ours: float, unit: str) -> Headline:
    return Headline(task=task, file=file, peer=peer, peer_value=value, ours=ours, unit=unit,
                    machine=machine_of(text), load=load_of(text), date="")


# results file name (results_NAME.md) -> its headlines; files without a peer are linked below the table.
HEADLINES: dict[str, Callable[[Path], list[Headline]]] = {}


def _register(name: str, read: Callable[[str, str], list[Headline]]) -> None:
    def headlines(path: Path) -> list[Headline]:
        date = date_of(path)
        return [replace(h, date=date) for h in read(path.read_text(), path.name)]
    HEADLINES[name] = headlines


for _name, _read in (("loader", _loader), ("loader_2k", _loader_2k), ("first", _first), ("s3", _s3),
                     ("s3_https", _s3_https), ("s3_start", _s3_start), ("clouds", _clouds), ("write", _write),
                     ("decode", _decode), ("dali", _dali), ("tokens", _tokens), ("pairs", _pairs)):
    _register(_name, _read)
