"""The rule that keeps the docs' figures from going stale: a page that quotes a measured figure
links the benchmarks/*.md file it comes from, and the figure is in that file's newest run (a
figure a later run replaced is stale).

A figure is a measured ratio with a decimal point (`1.47x`; a range `1.28-1.32x` is two), a rate
(`2,372 samples/s`, `1,459 images per CPU-s`, `813 MB/s`), a time with a decimal point (`0.31 s`)
or a peak memory (`1,010 MiB` in a sentence about the peak or PSS; a power of two there, `64 MiB`,
is a limit or setting), quoted in the prose of README.md or a docs page. Not figures: fenced code
blocks and inline code (a program's example output, checked where it matters by the tests of that
program), integer multiples (`4x larger`, a rule's `3x the median`), and the settings in SETTINGS,
each checked against the constant it states. Exempt: docs/changelog.md (the history, with the
figures of its day) and README.md's Benchmarks table (a copy of the headline table, checked row by
row in test_readme_ratios.py).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXEMPT = {"docs/changelog.md"}
# Quoted settings, not measurements: text -> (module, constant) whose value the text states.
SETTINGS = {"1.15x": ("trainer.report", "STRAGGLER_RATIO")}

_NUM = r"\d[\d,]*(?:\.\d+)?"
FIGURES = [
    re.compile(r"(?<![\w.,-])(\d+\.\d+)(?:-(\d+\.\d+))?x(?!\w)"),  # ratios with a decimal point
    re.compile(rf"(?<![\w.,-])({_NUM})(?:-({_NUM}))? ?(?:samples|images|tokens|sequences|rows|MB|GB)"
               r"(?:/s\b| per CPU-s)"),  # rates
    re.compile(r"(?<![\w.,-])(\d+\.\d+)(?:-(\d+\.\d+))? s\b"),  # times
]
MEMORY = re.compile(rf"(?<![\w.,-])({_NUM})(?:-({_NUM}))? MiB")
LINK = re.compile(r"\]\([^)\s]*benchmarks/([\w.-]+\.md)(?:#[^)]*)?\)")  # the site shows them under benchmarks/


def pages() -> list[Path]:
    """README.md and every docs page the figures rule covers."""
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in found if str(p.relative_to(ROOT)) not in EXEMPT]


def blocks(text: str) -> list[str]:
    """The page's prose blocks (paragraphs, list items, table rows), fenced code removed, inline
    code blanked: each block is where a figure and the link to its source must meet."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "``", text)
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        if all(line.startswith("    ") for line in para.split("\n") if line.strip()):
            continue  # an indented code block
        items = re.split(r"\n(?=\s*(?:[-*] |\d+\. |\|))", para)  # a list item or table row stands alone
        out += [" ".join(item.split()) for item in items if item.strip()]
    return out


def figures(block: str) -> list[str]:
    """Every figure the block quotes, each number as written (a range gives both ends)."""
    found = []
    for pattern in FIGURES:
        for m in pattern.finditer(block):
            if m.group(0) in SETTINGS:
                continue
            found += [n for n in m.groups() if n]
    for sentence in re.split(r"(?<=\.)\s", block):
        if re.search(r"\bpeak|\bPSS\b", sentence, re.I):
            found += [n for m in MEMORY.finditer(sentence) for n in m.groups() if n and not _power_of_two(n)]
    return found


def newest_runs(text: str) -> str:
    """What a results file says of its newest runs: the first top-level section of each kind (a file
    stacks runs newest first, one `# ` heading each, e.g. results_decode.md's region and CPU decode
    runs), each without the runs before it that it keeps below (`## The run before ...`)."""
    starts = [m.start() for m in re.finditer(r"^# ", text, re.M)] or [0]
    sections = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)])]
    newest: dict[str, str] = {}
    for section in sections:
        kind = re.sub(r",? *\d{4}-\d\d-\d\d.*", "", section.split("\n", 1)[0])
        newest.setdefault(kind, re.split(r"^## The run before", section, maxsplit=1, flags=re.M)[0])
    return "\n".join(newest.values())


def _power_of_two(number: str) -> bool:
    """1, 16, 128 MiB...: a size limit or setting (a buffer, a budget), not a measured peak."""
    value = float(number.replace(",", ""))
    return value.is_integer() and value >= 1 and int(value) & (int(value) - 1) == 0


def _appears(number: str, text: str) -> bool:
    plain = number.replace(",", "")
    return re.search(rf"(?<![\d.]){re.escape(plain)}(?![\d])", text) is not None


def problems(page: Path, text: str | None = None) -> list[str]:
    """What the page quotes against the rule, one line each (empty: it keeps the rule)."""
    text = page.read_text() if text is None else text
    if page.name == "README.md" and page.parent == ROOT:
        head, _, rest = text.partition("\n## Benchmarks\n")
        table_end = rest.find("\n## ")
        text = head + "\n## Benchmarks\n" + re.sub(r"^\|.*$", "", rest[:table_end], flags=re.M) + rest[table_end:]
    out = []
    name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
    for block in blocks(text):
        quoted = figures(block)
        if not quoted:
            continue
        sources = [ROOT / "benchmarks" / n for n in LINK.findall(block) if (ROOT / "benchmarks" / n).exists()]
        if not sources:
            out.append(f"{name}: quotes {', '.join(quoted)} without linking the benchmarks/*.md it comes from: "
                       f"{block[:120]!r}")
            continue
        measured = "\n".join(newest_runs(p.read_text()).replace(",", "") for p in sources)
        missing = [n for n in quoted if not _appears(n, measured)]
        if missing:
            out.append(f"{name}: {', '.join(missing)} not in {', '.join(p.name for p in sources)}: {block[:120]!r}")
    return out


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_quoted_figure_is_in_the_results_file_it_links(page):
    assert problems(page) == []


def test_the_settings_quoted_as_ratios_are_the_code_constants():
    for text, (module, name) in SETTINGS.items():
        assert float(text.rstrip("x")) == getattr(importlib.import_module(module), name), text


def test_a_made_up_or_unlinked_figure_is_caught():
    page = ROOT / "docs" / "guides" / "loading.md"
    link = "([results_loader.md](../benchmarks/results_loader.md))"
    assert problems(page, f"Measured: 57,254 samples/s {link}.\n") == []  # a figure of that file
    for made_up in (f"Measured: 9.87x the best peer {link}.", f"Measured: 57,255 samples/s {link}.",
                    f"Peak PSS 1,234 MiB {link}.", f"A 50 MB document peaked at 391 MiB of RSS {link}.",
                    f"The first batch in 0.123 s {link}.",
                    f"Measured: 1.28-9.99x {link}."):
        assert problems(page, made_up + "\n"), made_up
    assert problems(page, "Measured: 57,254 samples/s.\n")  # right figure, no link to its source
    first = "([results_first.md](../benchmarks/results_first.md))"
    assert problems(page, f"The first batch of 256 in 0.31 s {first}.\n") == []
    assert problems(page, f"The first batch of 256 in 1.29 s {first}.\n")  # a run before the newest
    assert problems(page, "```text\nMeasured: 9.87x\n```\n") == []  # example output is not prose
    assert problems(page, "Pieces of at most 1 MiB keep the peak within a 64 MiB buffer.\n") == []  # settings
