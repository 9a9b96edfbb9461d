"""README.md's Benchmarks table is a hand copy of rows of benchmarks/README.md (which run_all.gather()
writes): every task, peer, ratio, per-sample ratio and load it quotes must be that page's, so the copy
cannot drift from the measurements."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.headline import tables

ROOT = Path(__file__).resolve().parents[2]
RATIO = re.compile(r"\d+(?:\.\d+)?x")


def _readme_table(readme: str) -> list[dict[str, str]]:
    """The rows of the first table in README.md's "## Benchmarks" section."""
    section = readme.split("\n## Benchmarks\n", 1)[1].split("\n## ", 1)[0]
    found = tables(section)
    assert found, "README.md's Benchmarks section has no table"
    return found[0][1]


def _page_rows(page: str) -> dict[str, dict[str, str]]:
    """benchmarks/README.md's headline rows by task (the link text)."""
    _, rows = next((h, rows) for h, rows in tables(page) if rows and "ratio" in rows[0])
    return {re.sub(r"^\[(.*)\]\([^)]*\)$", r"\1", r["task"]): r for r in rows}


def mismatches(readme: str, page: str) -> list[str]:
    """What README.md's table quotes that benchmarks/README.md does not say, one line per difference."""
    page_rows, out = _page_rows(page), []
    for row in _readme_table(readme):
        task = row["task"]
        if task not in page_rows:
            out.append(f"{task!r}: no such task on benchmarks/README.md")
            continue
        ours = page_rows[task]
        views = RATIO.findall(ours["per sample: views, bytes"])[:1] or ["-"]
        expected = {"best peer": ours["best peer"], "shardify vs peer": ours["ratio"].strip("*"),
                    "per sample": views[0], "load": ours["load"]}
        out += [f"{task!r}: {column} {row.get(column)!r}, the page says {value!r}"
                for column, value in expected.items() if row.get(column) != value]
        quoted = set(RATIO.findall(" ".join(row.values())))
        out += [f"{task!r}: {r} is not on the page's row" for r in sorted(quoted - set(RATIO.findall(str(ours))))]
    return out


def test_readme_benchmarks_table_quotes_the_benchmarks_page():
    readme = (ROOT / "README.md").read_text()
    page = (ROOT / "benchmarks" / "README.md").read_text()
    assert len(_readme_table(readme)) >= 5
    assert mismatches(readme, page) == []


def test_a_drifted_ratio_peer_or_task_is_caught():
    readme = (ROOT / "README.md").read_text()
    page = (ROOT / "benchmarks" / "README.md").read_text()
    row = next(ln for ln in readme.splitlines() if ln.startswith("| Write tar shards"))
    ratio = RATIO.search(row).group()
    for drifted in (row.replace(ratio, "9.99x"), row.replace("webdataset", "ImageFolder"),
                    row.replace("Write tar shards", "Write shards")):
        assert mismatches(readme.replace(row, drifted), page), drifted
