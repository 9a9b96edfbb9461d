"""tests/cpu_census.py: a test's own CPU and its children's, per test, and the report over them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cpu_census import report
from tests.trainer.harness import REPO, env_for


def test_the_report_sums_per_test_and_per_file(tmp_path):
    rows = [{"id": "tests/a/test_x.py::test_one", "self": 1.0, "children": 4.0, "wall": 3.0},
            {"id": "tests/a/test_x.py::test_two", "self": 0.5, "children": 0.0, "wall": 0.6},
            {"id": "tests/b/test_y.py::test_three", "self": 2.0, "children": 0.0, "wall": 2.5}]
    (tmp_path / "cpu-gw0.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n")
    (tmp_path / "cpu-gw1.jsonl").write_text(json.dumps(rows[2]) + "\n")
    text = report(tmp_path, top=2)
    assert text.startswith("3 tests, 8 CPU-s (4 in the test processes, 4 in what they started)")
    body = text.splitlines()
    assert "tests/a/test_x.py::test_one" in body[3] and "tests/b/test_y.py::test_three" in body[4]
    assert not any("test_two" in line for line in body)  # beyond --top
    assert "    5.5  tests/a/test_x.py" in text and "    2.0  tests/b/test_y.py" in text
    with pytest.raises(SystemExit, match="no cpu-"):
        report(tmp_path / "none", top=2)


@pytest.mark.slow  # runs pytest, whose test starts a busy child
def test_a_childs_cpu_counts_for_the_test_that_started_it(tmp_path):
    (tmp_path / "test_busy.py").write_text(
        "import subprocess, sys\n"
        "def test_busy():\n"
        "    subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
        "while time.process_time() - t < 0.5: pass'], check=True)\n"
        "def test_idle():\n"
        "    pass\n")
    census = tmp_path / "census"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.cpu_census", "-p", "no:cacheprovider",
                           str(tmp_path / "test_busy.py")], cwd=REPO, env=env_for({"CPU_CENSUS_DIR": str(census)}),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (path,) = census.glob("cpu-*.jsonl")  # cpu-main.jsonl, or cpu-gwN.jsonl where PYTEST_XDIST_WORKER came along
    rows = {r["id"].split("::")[1]: r for r in map(json.loads, path.read_text().splitlines())}
    assert rows["test_busy"]["children"] >= 0.5  # the child's busy half second, from below
    assert rows["test_idle"]["children"] < 0.5
