"""A scheduled mixture that gains a source on resume: the loader says how many it gained (and 0 for
anything it would refuse), and the trainer resumes such a run instead of refusing its checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dataio.loader.make import make_loader
from dataio.plan.schedule import Schedule
from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset
from tests.trainer.harness import ok, run_here


@pytest.fixture
def three(tmp_path: Path) -> list[str]:
    urls = [str(tmp_path / name) for name in ("a", "b", "c")]
    for i, (url, sizes) in enumerate(zip(urls, ([40, 32], [24, 24], [16, 16]), strict=True)):
        write_tar_dataset(Store(url), sizes, seed=i, real_images=True)
    return urls


def _loader(urls: list[str], weights, **kw):
    return make_loader(urls, weights=weights, batch_size=4, num_workers=0, decode=None, **kw)


def test_the_loader_counts_sources_appended_since_a_saved_state(three) -> None:
    a, b, c = three
    with _loader([a, b], Schedule.parse("0.8,0.2@48; 0.2,0.8")) as saved:
        it = iter(saved)
        next(it), next(it)
        state = saved.state_dict()
    epoch = 72 + 48  # the saved mixture's epoch: both sources' sizes
    grown = _loader([a, b, c], Schedule.parse("0.8,0.2,0@48; 0.2,0.4,0.4"), epoch_samples=epoch)
    reordered = _loader([b, a, c], Schedule.parse("0.2,0.8,0@48; 0.4,0.2,0.4"), epoch_samples=epoch)
    fixed = _loader([a, b, c], [0.4, 0.3, 0.3], epoch_samples=epoch)
    same = _loader([a, b], Schedule.parse("0.8,0.2@48; 0.2,0.8"))
    try:
        assert grown.sources_added_since(state) == 1
        grown.load_state_dict(state)  # and it resumes it
        assert reordered.sources_added_since(state) == 0  # the saved sources are not first: refused on load
        assert fixed.sources_added_since(state) == 0  # fixed weights never gain a source
        assert same.sources_added_since(state) == 0
        assert grown.sources_added_since({"not": "a state"}) == 0
    finally:
        for loader in (grown, reordered, fixed, same):
            loader.close()


@pytest.mark.slow
def test_the_trainer_resumes_a_run_whose_schedule_gained_a_source(three, tmp_path: Path, capsys) -> None:
    a, b, c = three
    out = tmp_path / "out"
    common = ["--num-classes", "10", "--model", "tests.trainer.fakes:sleepy", "--batch-size", "4", "--image-size",
              "8", "--num-workers", "0", "--log-every", "2", "--out", str(out), "--dist-timeout-s", "60",
              "--epochs", "1"]
    ok(run_here(["--data", a, "--data", b, "--mix-schedule", "0.8,0.2@48; 0.2,0.8", *common, "--max-steps", "3"],
                capsys))
    grown = ["--data", a, "--data", b, "--data", c, "--mix-schedule", "0.8,0.2,0@48; 0.2,0.4,0.4",
             "--epoch-samples", "120"]
    res = ok(run_here([*grown, *common, "--resume", "auto"], capsys))
    assert "the mixture gained 1 source(s) since" in res.stderr + res.stdout
    sources = json.loads((out / "summary.json").read_text())["sources"]
    assert len(sources) == 3 and sources[2]["samples"] > 0  # c joined after sample 48
    # a source put before the saved ones is another dataset: refused, naming it
    bad = run_here(["--data", c, "--data", a, "--data", b, "--mix-schedule", "0,0.8,0.2@48; 0.4,0.2,0.4",
                    "--epoch-samples", "120", *common, "--resume", "auto"], capsys)
    assert bad.returncode != 0 and "dataset" in bad.stderr
