"""`python -m trainer.scaling` against delays it cannot miss: a loader that takes 50 ms per batch, a model
that sleeps 100 ms per step, and (swept) a comm hook that adds 100 ms to the all-reduce on 2 ranks
(each checked from below only, as in test_truthfulness: a busy machine makes a sleep longer, never shorter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.harness import REPO, env_for, run_study
from trainer.scaling import predict
from trainer.scaling import study as scaling

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

WAIT_S, COMPUTE_S, COMM_S, BATCH = 0.05, 0.1, 0.1, 4
DELAYED = "tests.trainer.fakes:delayed_allreduce"


def test_parse_keeps_trainer_flags_apart_and_checks_them():
    cfg, rest = scaling.parse(["--nproc", "2,1,2", "--sweep", "comm-hook=none,fp16", "--", "--data", "x"])
    assert cfg.nproc == (1, 2) and cfg.sweep_flag == "comm-hook" and cfg.sweep_values == ("none", "fp16")
    assert rest == ["--data", "x"]
    with pytest.raises(ValueError, match="--batch-size"):
        scaling.parse(["--", "--data", "x", "--batch-size", "0"])
    with pytest.raises(ValueError):
        scaling.parse(["--nproc", "0,1", "--", "--data", "x"])


def test_scaling_report_matches_the_injected_delays(tmp_path, capsys, monkeypatch):
    out = tmp_path / "scaling"
    argv = ["--nproc", "1,2", "--steps", "8", "--out", str(out),
           "--sweep", f"comm-hook=none,{DELAYED}", "--link-gbps", "10", "--link-latency-us", "200",
           "--storage-gbps", "0.0005", "--price-per-hour", "2", "--deadline-hours", "1", "--epochs", "2",
           "--input-batches", "8", "--",
           "--data", f"synthetic:?samples=4000&classes=4&delay_s={WAIT_S}", "--model", "tests.trainer.fakes:sleepy",
           "--batch-size", str(BATCH), "--image-size", "4", "--dist-timeout-s", "60"]
    code, said = run_study(argv, {"FAKE_COMPUTE_S": str(COMPUTE_S), "FAKE_COMM_DELAY_S": str(COMM_S)}, capsys,
                           monkeypatch)
    assert code == 0, said[-6000:]
    assert "scaling: measured" in said and "walls:" in said
    result = json.loads((out / "scaling.json").read_text())
    assert (out / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    plain, delayed = result["variants"]
    assert plain["variant"] == "none" and delayed["variant"] == DELAYED

    def ms(row: dict, stage: str) -> float:
        return row["stage_ms"][stage]  # mean over ranks, per step

    # Injected delays are checked from below only: a sleep lasts at least its length, longer on a
    # busy machine; windows, ratios and throughputs are not asserted (the benchmarks report them).
    for v in (plain, delayed):
        for row in v["measured"]:
            assert ms(row, "wait") >= 1000 * WAIT_S, row  # the loader's delay, in next()
            assert ms(row, "compute") >= 1000 * COMPUTE_S, row  # the model's sleep
        assert v["measured"][0]["efficiency"] == 1.0  # the 1-rank run is the base
    # The swept lever's effect: every rank of the 2-rank run shows the hook's delay as exposed comm.
    ranks = json.loads((Path(delayed["measured"][1]["dir"]) / "summary.json").read_text())["ranks"]
    assert all(r["comm_exposed_s"] / r["steps"] >= COMM_S for r in ranks), ranks
    assert ms(delayed["measured"][1], "comm_exposed") >= 1000 * COMM_S
    # Prediction inputs: a rank's own step (no data wait) holds the model's sleep; the loader alone
    # gives at most batch / delay samples/s; 0.5 Mbit/s of storage for 48-byte samples feeds 1302
    # samples/s in all.
    inputs = plain["inputs"]
    assert inputs["local_s"] >= COMPUTE_S
    assert result["input_ceiling"]["samples_per_s"] <= BATCH / WAIT_S
    assert inputs["bytes_per_sample"] == 3 * 4 * 4
    storage_total = 0.0005e9 / 8 / 48  # 1302 samples/s for all ranks together
    per_rank = inputs["samples_per_step"] / (inputs["local_s"] + inputs["wait_s"])  # ~27 samples/s at most
    wall = plain["walls"]
    assert wall["data_wall_kind"] == "storage"
    # Which wall comes first depends on the measured 2-rank efficiency (ranks sharing a busy machine's
    # cores can put the comm wall at 2): the report must name the earlier of the two it found.
    comm_at = wall["comm_wall_at"]
    assert wall["first"] == ("data" if comm_at is None or wall["data_wall_at"] < comm_at else "comm"), wall
    # The storage wall sits where the storage's share per rank first falls below what a rank does there.
    m, link = predict.Measured(**inputs), predict.Link(latency_s=200e-6, bytes_per_s=10e9 / 8)
    assert storage_total / per_rank <= wall["data_wall_at"] < 1.5 * storage_total / per_rank
    assert predict.at(m, link, wall["data_wall_at"] - 1)["limit"] != "storage"
    assert predict.at(m, link, wall["data_wall_at"])["limit"] == "storage"
    big = next(p for p in plain["predicted"] if p["world_size"] == 512)
    assert big["limit"] == "storage" and big["samples_per_s"] == pytest.approx(storage_total)
    # The bill: 2 ranks x $2/h for a 4,000-sample epoch at the measured rate; the choices follow from
    # the bills (which world size is cheapest depends on the measured rates: not asserted).
    one, two = plain["measured"]
    assert two["cost"]["dollars_per_epoch"] == pytest.approx(4 / 3600 * 4000 / two["samples_per_s"])
    choice = plain["choice"]
    assert choice["cheapest_dollars_per_epoch"] <= min(r["cost"]["dollars_per_epoch"] for r in (one, two))
    if one["cost"]["epoch_hours"] * 2 <= 1:  # 2 epochs within --deadline-hours 1 on one rank
        assert choice["smallest_meeting_deadline"] == 1


def test_allreduce_sweep_at_two_ranks_fits_a_link(tmp_path):
    out = tmp_path / "sweep.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "trainer.scaling.comm_sweep", "--out", str(out), "--max-bytes", str(4 * 2**20), "--repeats", "3"]
    done = subprocess.run(cmd, cwd=REPO, env=env_for(), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    sweep = json.loads(out.read_text())
    assert sweep["world_size"] == 2 and sweep["backend"] == "gloo"
    assert sorted(set(sweep["sizes_bytes"])) == [4096 * 4**k for k in range(6)]  # 4 kB .. 4 MB
    assert len(sweep["seconds"]) == 6 * 3 and min(sweep["seconds"]) > 0
    link = predict.fit_link(sweep["sizes_bytes"], sweep["seconds"], world_size=2)
    assert link.bytes_per_s > 0 and link.latency_s >= 0
