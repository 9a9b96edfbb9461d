"""A real text corpus that needs no download: the Python documentation that ships with CPython
(`pydoc_data.topics`, ~80 topics, ~500 KB) and the standard library's docstrings.

Counts depend on the Python build: callers must not hard-code them.
    python -m tools.text_corpus OUT.jsonl   writes both as JSON Lines ({"id", "text"} per line)
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

# Modules whose docstrings join the corpus: pure Python, present in every CPython build.
DOCSTRING_MODULES = ("json", "collections", "argparse", "pathlib", "textwrap", "functools", "itertools",
                     "dataclasses", "contextlib", "string", "re", "datetime", "enum", "heapq", "bisect", "shutil",
                     "tempfile", "csv", "logging", "unittest", "email.message", "http.client", "urllib.parse")


def pydoc_topics() -> Iterator[tuple[str, str]]:
    """(topic, text) of the Python documentation's topics, sorted by topic."""
    from pydoc_data.topics import topics

    yield from sorted(topics.items())


def docstrings(modules: Sequence[str] = DOCSTRING_MODULES) -> Iterator[tuple[str, str]]:
    """(qualified name, docstring) of each module and its public classes and functions, in order."""
    for name in modules:
        module = importlib.import_module(name)
        if module.__doc__:
            yield name, inspect.cleandoc(module.__doc__)
        for attr in sorted(vars(module)):
            obj = getattr(module, attr)
            if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__doc__:
                yield f"{name}.{attr}", inspect.cleandoc(obj.__doc__)


def documents() -> list[dict[str, str]]:
    """Every document of the corpus as {"id", "text"}: the topics, then the docstrings."""
    return [{"id": f"topic:{k}", "text": v} for k, v in pydoc_topics()] + \
        [{"id": f"doc:{k}", "text": v} for k, v in docstrings()]


def write_jsonl(path: Path, docs: Sequence[dict[str, str]]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc) + "\n")
    return path


if __name__ == "__main__":
    out = write_jsonl(Path(sys.argv[1]), documents())
    print(f"wrote {out}")
