"""Where the suite's CPU goes, per test: a pytest plugin and its report (a developer's tool, off by default).

    CPU_CENSUS_DIR=/tmp/census .venv/bin/python -m pytest -n auto -p tests.cpu_census
    .venv/bin/python -m tests.cpu_census /tmp/census [--top 40]

Each test process appends one JSON line per test to DIR/cpu-<worker>.jsonl: the test's own CPU-seconds
(set-up, call and tear-down), the CPU of the child processes reaped meanwhile (torchrun jobs, CLI runs,
servers), and its wall time. A child's CPU counts for the test that reaped it: a session server's for the
last test of its process, a loader worker left to the garbage collector for a later test. Processes that
detach (Ray's daemons) are not counted. The report sums per test and per file.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

_OUT: list[Any] = []


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    where = os.environ.get("CPU_CENSUS_DIR")
    if not where:
        yield
        return
    if not _OUT:
        Path(where).mkdir(parents=True, exist_ok=True)
        _OUT.append(open(Path(where) / f"cpu-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl", "a"))
    (own, children), began = _cpu(), time.monotonic()
    yield
    own2, children2 = _cpu()
    row = {"id": item.nodeid, "self": round(own2 - own, 3), "children": round(children2 - children, 3),
           "wall": round(time.monotonic() - began, 3)}
    _OUT[0].write(json.dumps(row) + "\n")
    _OUT[0].flush()


def report(where: Path, top: int) -> str:
    rows = [json.loads(line) for path in sorted(where.glob("cpu-*.jsonl")) for line in path.read_text().splitlines()]
    if not rows:
        raise SystemExit(f"no cpu-*.jsonl in {where}: run pytest with CPU_CENSUS_DIR={where} -p tests.cpu_census")
    cpu = lambda r: r["self"] + r["children"]  # noqa: E731
    own, children, wall = (sum(r[k] for r in rows) for k in ("self", "children", "wall"))
    lines = [f"{len(rows)} tests, {own + children:.0f} CPU-s ({own:.0f} in the test processes, {children:.0f} in "
             f"what they started), {wall:.0f} s of test wall time", "", f"{'CPU-s':>7} {'own':>6} {'wall':>6}  test"]
    for r in sorted(rows, key=cpu, reverse=True)[:top]:
        lines.append(f"{cpu(r):7.1f} {r['self']:6.1f} {r['wall']:6.1f}  {r['id']}")
    per_file: Counter[str] = Counter()
    for r in rows:
        per_file[r["id"].split("::")[0]] += cpu(r)
    lines += ["", f"{'CPU-s':>7}  file"] + [f"{c:7.1f}  {f}" for f, c in per_file.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.cpu_census", description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args(argv)
    print(report(args.dir, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
