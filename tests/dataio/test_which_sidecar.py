"""The loader-state sidecar `which` reads: sealed (a digit changed is refused naming the file), checked
field by field, its local paths absolute so `which` answers from any directory (issue 32, 3; issue 30, 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from dataio.errors import StateError
from dataio.loader.make import make_loader
from dataio.loader.sidecar import SEAL_KEY, sidecar_doc
from dataio.loader.which import run_which
from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset

REPO = Path(__file__).resolve().parents[2]
NAME = "ckpt-000000003.loader-state.json"


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch) -> Path:
    """A run started in tmp_path/work with `--data data/ds` (relative): 3 steps of batch 4, its sidecar
    in tmp_path/work/out/checkpoints; the working directory is tmp_path/work."""
    work = tmp_path / "work"
    write_tar_dataset(Store(str(work / "data" / "ds")), [10, 14])
    monkeypatch.chdir(work)
    loader = make_loader("data/ds", batch_size=4, num_workers=0, decode=None, seed=3)
    loader.set_epoch(0)
    it = iter(loader)
    keys = [next(it)["__key__"] for _ in range(3)]
    it.close()
    (work / "out" / "checkpoints").mkdir(parents=True)
    (work / "out" / "checkpoints" / NAME).write_bytes(
        sidecar_doc(step=3, epoch=0, grad_accum=1, sources=[("data/ds", None)], loader_state=loader.state_dict()))
    (work / "keys.json").write_text(json.dumps(keys))
    return work / "out"


def _which(where: str, step: int) -> list[dict]:
    return [json.loads(x) for x in run_which(Namespace(run=where, step=step, rank=None, export=None, json=True))]


def _sidecar(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / NAME


@pytest.mark.slow  # the CLI in a subprocess
def test_which_answers_from_another_directory(run_dir: Path, tmp_path: Path, monkeypatch) -> None:
    keys = json.loads((run_dir.parent / "keys.json").read_text())
    doc = json.loads(_sidecar(run_dir).read_text())
    assert doc["sources"][0]["url"] == str(run_dir.parent / "data" / "ds") and doc["cwd"] == str(run_dir.parent)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert [r["key"] for r in _which(str(run_dir), 2)] == keys[1]
    cli = subprocess.run([sys.executable, "-m", "sharding.cli", "which", str(run_dir), "--step", "3", "--json"],
                         cwd=elsewhere, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                         text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert [json.loads(x)["key"] for x in cli.stdout.splitlines()] == keys[2]


def test_an_older_sidecar_with_a_relative_path_is_resolved(run_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """Written before paths were stored absolute (no cwd, no seal): tried against the working directory,
    then each folder above the sidecar's."""
    doc = json.loads(_sidecar(run_dir).read_text())
    doc = {k: v for k, v in doc.items() if k not in ("cwd", SEAL_KEY)}
    doc["sources"] = [{"url": "data/ds", "weight": None}]
    _sidecar(run_dir).write_text(json.dumps(doc))
    monkeypatch.chdir(tmp_path)
    keys = json.loads((run_dir.parent / "keys.json").read_text())
    assert [r["key"] for r in _which(str(run_dir), 1)] == keys[0]


def _damaged(run_dir: Path, change) -> str:
    doc = json.loads(_sidecar(run_dir).read_text())
    change(doc)
    _sidecar(run_dir).write_text(json.dumps(doc, sort_keys=True))
    with pytest.raises(StateError) as got:
        _which(str(run_dir), 2)
    return str(got.value)


@pytest.mark.slow  # the CLI in a subprocess
def test_a_sidecar_with_one_digit_changed_is_refused_naming_it(run_dir: Path) -> None:
    # It used to name another step's samples, exit 0 (issue 32, failure 3).
    text = _sidecar(run_dir).read_text()
    assert '"step": 3' in text
    _sidecar(run_dir).write_text(text.replace('"step": 3', '"step": 4'))
    with pytest.raises(StateError, match=rf"{_sidecar(run_dir)}: checksum mismatch .*changed after the trainer"):
        _which(str(run_dir), 2)
    cli = subprocess.run([sys.executable, "-m", "sharding.cli", "which", str(run_dir), "--step", "2"],
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and "checksum mismatch" in cli.stderr and "Traceback" not in cli.stderr


@pytest.mark.parametrize("field,value", [("loader", None), ("step", "3"), ("grad_accum", 0), ("sources", []),
                                         ("epoch", 1.5)])
def test_an_incomplete_or_mistyped_sidecar_says_so_in_one_sentence(run_dir: Path, field: str, value) -> None:
    # A sidecar missing `loader` used to fail with KeyError: 'loader'.
    def change(doc: dict) -> None:
        if value is None:
            del doc[field]
        else:
            doc[field] = value
    message = _damaged(run_dir, change)
    assert message.startswith(f"{_sidecar(run_dir)} is not a complete loader-state sidecar: it")
    assert (f"has no {field!r}" if value is None else f"its {field!r} is {value!r}") in message, message


@pytest.mark.parametrize("step", [0, -1])
def test_step_zero_or_below_is_refused_as_not_a_step(run_dir: Path, step: int) -> None:
    # It was refused as "earlier steps ran before the history began".
    with pytest.raises(ValueError, match=rf"step {step} is not an optimizer step: they count from 1 .* 1\.\.3"):
        _which(str(run_dir), step)
