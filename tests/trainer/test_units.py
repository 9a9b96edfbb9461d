"""Fast in-process checks: config parsing, the comm split, the report's judgement, trace shape, checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from dataio.storage.store import Store
from trainer import checkpoint as ckpt_io
from trainer.config import TrainConfig
from trainer.flags import parse_config
from trainer.models import build_model
from trainer.report import combine, summarize
from trainer.schedule import WarmupCosine
from trainer.synthetic import MemoryLoader
from trainer.timing import StepRecord, StepTimer, _union_length
from trainer.trace import chrome_trace


def test_toml_then_flags_and_unknown_keys(tmp_path):
    conf = tmp_path / "t.toml"
    conf.write_text('data = "synthetic:"\nbatch_size = 7\nlr = 1\n[trainer]\nepochs = 3\n')
    cfg = parse_config(["--config", str(conf), "--batch-size", "9"])
    assert (cfg.batch_size, cfg.epochs, cfg.lr, cfg.data) == (9, 3, 1.0, "synthetic:")
    conf.write_text('data = "x"\nbatch_sise = 7\n')
    with pytest.raises(ValueError, match=r"unknown keys \['batch_sise'\]"):
        parse_config(["--config", str(conf)])
    conf.write_text('data = "x"\nepochs = "3"\n')
    with pytest.raises(ValueError, match="'epochs' .* must be int"):
        parse_config(["--config", str(conf)])
    with pytest.raises(ValueError, match="--data is required"):
        parse_config([])
    with pytest.raises(TypeError):
        TrainConfig("x")  # keyword-only


def test_models_and_factories():
    assert build_model("resnet", num_classes=4, image_size=32)(torch.zeros(2, 3, 32, 32)).shape == (2, 4)
    assert build_model("mlp", num_classes=4, image_size=8)(torch.zeros(2, 3, 8, 8)).shape == (2, 4)
    assert build_model("tests.trainer.fakes:sleepy", num_classes=2, image_size=8)(torch.zeros(1, 3, 8, 8)).shape == (1, 2)
    with pytest.raises(ValueError, match="unknown model 'vit'"):
        build_model("vit", num_classes=2, image_size=8)
    with pytest.raises(ValueError, match="cannot import"):
        build_model("no_such_pkg.x:f", num_classes=2, image_size=8)
    with pytest.raises(TypeError, match="not a torch.nn.Module"):
        build_model("tests.trainer.fakes:not_a_module", num_classes=2, image_size=8)


def test_comm_split_exposed_and_overlapped():
    timer = StepTimer(torch.device("cpu"), keep_slices=0)
    # backward from 0 to 10; buckets ready at 2 and 6, done at 5 and 9.5: only 6 -> 9.5 is exposed.
    exposed, overlapped = timer._comm_split(0.0, [(2.0, [5.0]), (6.0, [9.5])], 10.0)
    assert exposed == pytest.approx(3.5) and overlapped == pytest.approx(6.5 - 3.5)
    assert _union_length([(0, 2), (1, 3), (5, 6)]) == 4


def _rec(wait: float, compute: float, exposed: float = 0.0, load: float = 0.0) -> StepRecord:
    return StepRecord(step=1, epoch=0, start_s=0.0, step_s=wait + compute + exposed, wait_s=wait, h2d_s=0.0,
                      compute_s=compute, comm_exposed_s=exposed, comm_overlapped_s=0.0, opt_s=0.0, samples=8,
                      read_s=load, decode_s=0.0)


def test_report_names_the_straggler_and_the_verdict():
    fast = summarize([_rec(0.0, 0.1, exposed=0.1, load=0.05)] * 4, rank=0)
    slow = summarize([_rec(0.0, 0.2, load=0.05)] * 4, rank=1)
    other = summarize([_rec(0.0, 0.1, exposed=0.1, load=0.05)] * 4, rank=2)
    rep = combine([fast, slow, other])
    assert rep["straggler"] == 1 and rep["slowest_rank_vs_median"] == pytest.approx(2.0)
    assert rep["verdict"].startswith("COMPUTE-BOUND") and "rank 1" in rep["verdict"]
    assert rep["hidden_load_share"] == pytest.approx(1.0)
    starved = combine([summarize([_rec(0.3, 0.1, load=0.35)], rank=0)], decode="cpu")
    assert starved["wait_share"] == pytest.approx(0.75) and starved["verdict"].startswith("INPUT-BOUND")
    assert starved["hidden_load_share"] == pytest.approx(0.05 / 0.35)


def test_chrome_trace_has_a_track_per_rank():
    steps = [{"step": 1, "epoch": 0,
              "slices": [("wait", 100.0, 0.5), ("compute", 100.5, 0.2), ("comm_overlapped", 100.6, 0.05)]}]
    trace = chrome_trace([steps, steps])
    json.dumps(trace)
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in xs} == {0, 1} and xs[0]["ts"] == 0 and xs[0]["dur"] == 500000
    assert any(e["tid"] == 1 and e["name"] == "all-reduce (overlapped)" for e in xs)


def test_schedule_follows_samples_not_steps():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    s = WarmupCosine(opt, base_lr=1.0, total_samples=1000, warmup_samples=100, min_ratio=0.0)
    assert s.lr < 0.02
    s.step(100)
    assert s.lr == pytest.approx(1.0)
    s.step(450)
    assert s.lr == pytest.approx(0.5) and opt.param_groups[0]["lr"] == pytest.approx(0.5)


def test_memory_loader_state_moves_between_world_sizes():
    labels = torch.arange(50)
    images = torch.zeros(1, 3, 2, 2, dtype=torch.uint8)
    two = [MemoryLoader(images, labels, batch_size=4, rank=r, world_size=2, seed=1) for r in range(2)]
    seen = []
    for loader in two:
        it = iter(loader)
        seen += [k for _ in range(2) for k in next(it)["__key__"]]
    one = MemoryLoader(images, labels, batch_size=4, rank=0, world_size=1, seed=1)
    one.load_state_dict(two[0].state_dict())
    seen += [k for b in one for k in b["__key__"]]
    assert len(seen) == len(set(seen)) and 50 - len(seen) < 4


def _save(store: Store, step: int) -> str:
    return ckpt_io.save(store, step, {"identity": {"model": "m"}, "x": torch.ones(2), "rng": [ckpt_io.rng_state()]},
                        keep=2)


def test_checkpoints_atomic_newest_and_checked(tmp_path):
    store = Store(str(tmp_path / "ck"))
    for step in (3, 10, 7):
        _save(store, step)
    assert ckpt_io.list_checkpoints(store) == ["ckpt-000000007.pt", "ckpt-000000010.pt"]
    assert all(not n.startswith(".") for n in store.list())  # no temporaries left
    where, name = ckpt_io.locate("auto", store, None)
    ckpt = ckpt_io.load(where, name)
    ckpt_io.set_rng_state(ckpt["rng"][0])
    first = torch.rand(3)
    ckpt_io.set_rng_state(ckpt["rng"][0])
    assert torch.equal(torch.rand(3), first)  # the saved RNG state round-trips through weights_only load
    ckpt_io.check_identity(ckpt, {"model": "m"}, where=name)
    with pytest.raises(ckpt_io.CheckpointMismatch, match="model='m', this run has model='n'"):
        ckpt_io.check_identity(ckpt, {"model": "n"}, where=name)
    assert ckpt_io.locate("none", store, None) is None
    with pytest.raises(FileNotFoundError):
        ckpt_io.locate(str(tmp_path / "ck" / "ckpt-000000001.pt"), store, None)
    (tmp_path / "ck" / "ckpt-000000099.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ckpt_io.CheckpointMismatch, match="not a readable trainer checkpoint"):
        ckpt_io.load(store, "ckpt-000000099.pt")


@pytest.mark.slow
def test_checkpoints_on_s3(s3_server):
    store = Store(f"s3://{s3_server.new_bucket()}/run/checkpoints", s3_server.options())
    _save(store, 1)
    _save(store, 2)
    _save(store, 3)
    assert ckpt_io.list_checkpoints(store) == ["ckpt-000000002.pt", "ckpt-000000003.pt"]
    where, name = ckpt_io.locate("auto", store, s3_server.options())
    assert torch.equal(ckpt_io.load(where, name)["x"], torch.ones(2))


def test_step_timer_reports_the_wait_it_was_given():
    import time as _time

    def slow(n: int):
        for i in range(n):
            _time.sleep(0.05)
            yield i

    timer = StepTimer(torch.device("cpu"), keep_slices=5)
    batches = timer.batches(slow(3))
    records = []
    for step in range(3):
        timer.begin()
        next(batches)
        with timer.phase("h2d"):
            pass
        with timer.phase("fwd_bwd"):
            _time.sleep(0.01)
        records.append(timer.end(step=step + 1, epoch=0, samples=4, read_s=0.05, decode_s=0.0))
    batches.close()
    assert all(r.wait_s >= 0.05 and r.compute_s >= 0.01 and r.comm_exposed_s == 0 for r in records)
    assert all(r.step_s >= r.wait_s + r.compute_s for r in records)
    names = [name for name, _, _ in records[0].slices]
    assert names == ["wait", "h2d", "compute"]


@pytest.mark.slow
def test_a_run_checkpoints_to_s3_and_resumes_from_there(s3_server, tmp_path, monkeypatch, capsys):
    from trainer.__main__ import main

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret)
    url = f"s3://{s3_server.new_bucket()}/run/ckpt"
    args = ["--data", "synthetic:?samples=64&classes=4", "--model", "mlp", "--image-size", "4", "--batch-size", "8",
            "--out", str(tmp_path), "--checkpoint-dir", url, "--s3-endpoint-url", s3_server.endpoint_url, "--no-live"]
    assert main([*args, "--max-steps", "2"]) == 0
    assert main([*args, "--max-steps", "4"]) == 0
    notes = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any(n["kind"] == "note" and f"resumed from {url}/ckpt-000000002.pt" in n["text"] for n in notes)
    assert s3_server.secret not in capsys.readouterr().out


def test_data_mixture_flags_and_toml(tmp_path):
    from trainer.config import DataSource, parse_data_spec

    cfg = parse_config(["--data", "s3://b/web=0.7", "--data", "runs/gold=0.1", "--data", "runs/curated"])
    assert cfg.data == (DataSource("s3://b/web", 0.7), DataSource("runs/gold", 0.1), DataSource("runs/curated", 1.0))
    assert cfg.data_label == "s3://b/web=0.7 + runs/gold=0.1 + runs/curated"
    assert parse_config(["--data", "runs/x"]).data == "runs/x"  # one URL stays the plain case
    assert parse_data_spec("a=b=2") == DataSource("a=b", 2.0)  # the last '=' splits
    assert parse_data_spec("s3://b/k=v/data") == DataSource("s3://b/k=v/data")  # not a weight: part of the URL
    assert parse_data_spec("synthetic:?samples=96&classes=3") == DataSource("synthetic:?samples=96&classes=3")
    assert parse_data_spec("synthetic:?samples=96=0.5") == DataSource("synthetic:?samples=96", 0.5)
    conf = tmp_path / "mix.toml"
    conf.write_text('epochs = 2\n[[data]]\nurl = "runs/web"\nweight = 7\n[[data]]\nurl = "runs/gold"\nweight = 0.5\n')
    cfg = parse_config(["--config", str(conf)])
    assert cfg.data == (DataSource("runs/web", 7.0), DataSource("runs/gold", 0.5)) and cfg.epochs == 2
    assert json.loads(json.dumps(__import__("trainer.config").config.config_dict(cfg)))["data"][1] == {
        "url": "runs/gold", "weight": 0.5}
    conf.write_text('[[data]]\nurl = "runs/web"\nweigth = 7\n')
    with pytest.raises(ValueError, match="url .* and weight"):
        parse_config(["--config", str(conf)])
    with pytest.raises(ValueError, match="finite weight >= 0"):
        parse_config(["--data", "runs/a=-1", "--data", "runs/b"])
    with pytest.raises(ValueError, match="cannot be mixed"):
        parse_config(["--data", "synthetic:", "--data", "runs/b"])


def test_mixture_report_shows_observed_vs_requested_shares():
    from rich.console import Console

    from trainer.display import mix_cell, sources_table
    from trainer.report import metrics_line, source_rows

    rows = [{**summarize([_rec(0.1, 0.9)], rank=r), "source_samples": counts}
            for r, counts in enumerate([[6, 1, 1], [5, 2, 1]])]
    sources = source_rows(rows, names=["s3://b/web", "runs/curated", "runs/gold/"], requested=[0.7, 0.2, 0.1],
                          samples_per_s=combine(rows)["samples_per_s"])
    assert [s["samples"] for s in sources] == [11, 3, 2]
    assert sources[0]["observed"] == pytest.approx(11 / 16) and sources[0]["samples_per_s"] == pytest.approx(11.0)
    assert mix_cell(sources) == "web 69%/70% curated 19%/20% gold 12%/10%"
    rep = {**combine(rows), "sources": sources}
    line = metrics_line(rep, step=1, epoch=0, loss=0.0, lr=0.1)
    assert json.loads(json.dumps(line))["sources"][2]["requested"] == 0.1
    console = Console(width=150, record=True)
    console.print(sources_table(sources))
    text = console.export_text()
    assert "runs/curated" in text and "68.8%" in text
    assert "sources" not in metrics_line(combine(rows), step=1, epoch=0, loss=0.0, lr=0.1)


@pytest.mark.parametrize("timeout_s", [1.0, 15.0, 120.0])
def test_a_stopped_rank_is_named_within_the_dist_timeout_by_construction(timeout_s):
    # The promise as arithmetic (the 2-rank run in test_lost_rank checks it happens): the
    # collective gives up, the heartbeats are watched and the message written, all within the timeout.
    from trainer.runtime import Watch

    w = Watch.for_timeout(timeout_s)
    assert w.collective_s + w.watch_s + w.slack_s == pytest.approx(timeout_s)
    assert w.collective_s > 0 and w.watch_s > 0 and w.slack_s > 0 and w.every_s < w.watch_s
