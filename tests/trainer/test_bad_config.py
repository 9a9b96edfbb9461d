"""Bad configuration: one clear message from rank 0, every rank exits non-zero promptly, never a hang."""

from __future__ import annotations

import pytest

from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset
from tests.trainer.harness import run_here, run_trainer
from trainer.__main__ import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SYNTH = "synthetic:?samples=64&classes=4"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("ds") / "train"
    write_tar_dataset(Store(str(root)), [30, 20], real_images=True)
    return str(root)


DIST_TIMEOUT_S = 60  # the process-group deadline the runs below set


def _fails(args: list[str], message: str, *, nproc: int = 2) -> str:
    """Run under torchrun; it must fail with one error line naming `message`. A rank that waited out
    the process-group deadline would end on a timeout error instead (not a wall-time bound)."""
    result = run_trainer([*args, "--dist-timeout-s", str(DIST_TIMEOUT_S)], nproc=nproc,
                         timeout_s=DIST_TIMEOUT_S + 30)
    assert result.returncode != 0
    return _one_error(result.stderr, message)


def _fails_here(args: list[str], message: str, capsys) -> str:
    """One process, in this interpreter (no torchrun): main() returns 2 and prints one error line."""
    result = run_here(args, capsys)
    assert result.returncode == 2
    return _one_error(result.stderr, message)


def _one_error(stderr: str, message: str) -> str:
    lines = [x for x in stderr.splitlines() if x.startswith("trainer: error:")]
    assert len(lines) == 1, stderr[-3000:]  # rank 0 only
    assert message in lines[0], lines[0]
    return lines[0]


def test_unknown_model_stops_every_rank(tmp_path):
    line = _fails(["--data", SYNTH, "--model", "nope", "--out", str(tmp_path)], "unknown model 'nope'")
    assert "resnet" in line  # names the choices


def test_a_failure_on_one_rank_only_stops_every_rank(tmp_path):
    _fails(["--data", SYNTH, "--model", "tests.trainer.fakes:fails_on_rank1", "--out", str(tmp_path)],
           "refuses to build on rank 1 (on rank 1)")


# The two below fail in set-up, as the unknown model does: in this interpreter (one process), since the
# runs above show a set-up failure stopping every rank.
def test_missing_manifest_names_the_url(tmp_path, capsys):
    empty = tmp_path / "nothing-here"
    empty.mkdir()
    _fails_here(["--data", str(empty), "--num-classes", "3", "--out", str(tmp_path / "o")], str(empty), capsys)


def test_batch_larger_than_a_ranks_share(tmp_path, dataset, capsys):
    line = _fails_here(["--data", dataset, "--num-classes", "10", "--batch-size", "60", "--num-workers", "0",
                        "--out", str(tmp_path)], "--batch-size", capsys)
    assert "a rank's share is 0 batches" in line


def test_bad_flag_and_bad_value(capsys):
    _fails_here(["--data", SYNTH, "--nope", "1"], "unknown flags ['--nope', '1']", capsys)
    _fails_here(["--data", SYNTH, "--epochs", "many"], "--epochs", capsys)
    _fails_here(["--data", SYNTH, "--optimizer", "lion"], "--optimizer must be one of", capsys)


def test_checkpoint_from_another_model_or_dataset_is_refused(tmp_path, capsys):
    out = tmp_path / "o"
    base = ["--model", "tests.trainer.fakes:sleepy", "--max-steps", "2", "--batch-size", "8", "--image-size", "4",
            "--out", str(out), "--no-live"]
    assert main(["--data", SYNTH, *base]) == 0
    assert list((out / "checkpoints").glob("ckpt-*.pt"))
    other_model = [a if a != "tests.trainer.fakes:sleepy" else "mlp" for a in base]
    _fails_here(["--data", SYNTH, *other_model], "written with model='tests.trainer.fakes:sleepy'", capsys)
    _fails_here(["--data", "synthetic:?samples=80&classes=4", *base], "written with dataset=", capsys)
    assert main(["--data", "synthetic:?samples=80&classes=4", *base, "--resume", "none"]) == 0


def test_help_lists_every_flag_with_its_default(capsys):
    with pytest.raises(SystemExit) as done:  # in this interpreter: `python -m trainer --help` is main(["--help"])
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for text in ("--batch-size", "--grad-accum", "--resume", "--checkpoint-every", "--dist-timeout-s",
                 "(default: 120.0)", "--config"):
        assert text in out
