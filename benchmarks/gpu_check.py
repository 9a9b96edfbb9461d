"""Everything a lent GPU machine should tell us, in one run of at most 5 minutes.

    PYTHONPATH=. python3 -m benchmarks.gpu_check [--results benchmarks/results_gpu.md]
    PYTHONPATH=. python3 -m benchmarks.gpu_check --dry-run    # every step on CPU twins, tiny sizes

Steps: the environment (GPU, driver, CUDA, torch, NCCL, nvImageCodec, DALI or not); the project's
GPU tests; GPU decode of the loader's RAW stream at batch 256 on a set generated here (nvJPEG through
torchvision, the loader's own GPU decoder, DALI's mixed decoders when DALI imports) against our CPU
decode per core; the race (gpu_race.py: the synthetic ceiling, ImageFolder, decode="cpu", "gpu" and
"auto" feeding ResNet-50 bf16 channels_last at batch 256 in one loop); the trainer on 1 GPU with NCCL
under torchrun with the same settings where its flags exist, with its overlap report. Writes the
results file (GPU model, date, every figure); exits 2 on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
# The tests that skip without a CUDA GPU (grep tests for cuda skips): nvJPEG vs region decode runs
# without DALI; DALI's mixed-decoder test skips where DALI is absent (the GPU machine's image).
GPU_TESTS = ("tests/dataio/test_decode_region.py", "tests/dataio/test_decode_dali.py",
             "tests/dataio/test_decode_gpu.py")
GPU_SELECT = "gpu or cuda or nvjpeg"
BUDGET_S = 300.0


class Sizes:
    """What each step does: the real run's sizes, or the dry run's tiny ones."""

    def __init__(self, dry_run: bool) -> None:
        self.num_images = 96 if dry_run else 3072
        self.batch_size = 16 if dry_run else 256
        self.num_batches = 3 if dry_run else 11  # the first is a warm-up
        self.image_size = 32 if dry_run else 224
        self.train_steps = 4 if dry_run else 60
        self.train_batch = 8 if dry_run else 256
        self.num_workers = 1 if dry_run else min(12, max(2, (os.cpu_count() or 4) - 2))
        self.step_timeout_s = 120 if dry_run else 150
        self.race_warmup = 1 if dry_run else 5  # untimed steps per race row (cuDNN autotune, workers' start)
        self.race_steps = 3 if dry_run else 25


def environment(device: torch.device) -> dict[str, Any]:
    """GPU model, driver, CUDA, torch, NCCL, torchvision, DALI, simplejpeg, region decode."""
    from dataio.decode import region

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda (torch built for)": torch.version.cuda or "none", "cpu cores": os.cpu_count()}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu memory GiB"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        env["driver"] = _nvidia_smi("driver_version")
    else:
        env["gpu"] = "none (dry run: CPU twins)"
    for name in ("torchvision", "nvidia.nvimgcodec", "nvidia.dali", "simplejpeg"):
        env[name] = _version(name)
    env["region decode"] = "built" if region.available() else f"not built ({region.why_unavailable()})"
    return env


def _version(module: str) -> str:
    if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
        return "absent"
    try:
        return str(getattr(__import__(module, fromlist=["_"]), "__version__", "present"))
    except Exception as exc:  # noqa: BLE001 - a broken install is worth reporting, not fatal
        return f"broken ({type(exc).__name__}: {exc})"


def _nvidia_smi(field: str) -> str:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no nvidia-smi)"


def gpu_tests(sizes: Sizes, timeout_s: float) -> dict[str, Any]:
    """pytest on GPU_TESTS' GPU cases (-k GPU_SELECT -rs: skips say why); its summary line."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfs", "--tb=line", "-p", "no:cacheprovider", "-k", GPU_SELECT, *GPU_TESTS]
    out = _run(cmd, timeout_s)
    last = (out["stdout"].strip().splitlines() or ["(no output)"])[-1]
    lines = out["stdout"].splitlines()
    skips = [line for line in lines if line.startswith("SKIPPED")]
    # --tb=line: one "path:line: Error: message" line per failure, then -rf's "FAILED test" lines
    failures = [line for line in lines if line.startswith("FAILED") or ": AssertionError" in line
                or "Error:" in line][:12]
    res = {"command": " ".join(["pytest", *cmd[3:]]), "summary": last, "skips": skips[:6],
           "failures": failures, "returncode": out["returncode"]}
    if out["returncode"] not in (0, 5):  # 5: nothing collected
        res["error"] = f"pytest exit {out['returncode']}: {last} {out['stderr'][-800:]}"
    return res


def make_dataset(work: Path, sizes: Sizes) -> str:
    """ImageNet-like JPEGs (~100 KB at 500x375, bench_decode's generator) written as tar shards."""
    from benchmarks.bench_decode import make_jpegs

    folder = work / "images" / "class0"
    paths = make_jpegs(folder, sizes.num_images, seed=23)
    for i, path in enumerate(paths):  # two classes, so the trainer has something to learn
        if i % 2:
            (work / "images" / "class1").mkdir(exist_ok=True)
            path.rename(work / "images" / "class1" / path.name)
    url = str(work / "shards")
    _run([sys.executable, "-m", "sharding.cli", "write", str(work / "images"), url, "--format", "tar", "--quiet",
          "--shard-size", "32MB"], 600, check=True)
    return url


def decode_step(url: str, sizes: Sizes, device: torch.device) -> dict[str, Any]:
    from benchmarks import gpu_decode

    batches = gpu_decode.raw_batches(url, batch_size=sizes.batch_size, num_batches=sizes.num_batches)
    out = gpu_decode.measure_nvjpeg(batches, device)
    out["dali"] = gpu_decode.dali_rows(batches, device)
    out["gpu_decoder"] = gpu_decode.measure_gpu_decoder(batches, device)
    out["cpu_per_core"] = gpu_decode.measure_cpu_per_core(batches)
    return out


def race_step(url: str, work: Path, sizes: Sizes, device: torch.device, dry_run: bool) -> dict[str, Any]:
    from benchmarks import gpu_race

    return gpu_race.race(url, work / "images", sizes=sizes, device=device, dry_run=dry_run)


def trainer_flags(help_text: str, *, dry_run: bool) -> tuple[list[str], list[str]]:
    """(the race's settings among the trainer's flags, those it lacks): --decode auto, bf16, channels_last,
    ResNet-50 (the dry run keeps the toy ResNet and the CPU)."""
    decode_help = re.search(r"--decode DECODE(.*?)(\n  --|$)", help_text, re.S)
    wanted = [("--decode auto", bool(decode_help and "auto" in decode_help.group(1))),
              ("--precision bf16", "--precision" in help_text), ("--channels-last", "--channels-last" in help_text)]
    if not dry_run:
        wanted.append(("--model resnet50", "resnet50" in help_text))
    have = [w for w, ok in wanted if ok]
    return [part for w in have for part in w.split()], [w for w, ok in wanted if not ok]


def train_step(url: str, work: Path, sizes: Sizes, device: torch.device, timeout_s: float) -> dict[str, Any]:
    """`torchrun --nproc_per_node=1 -m trainer` (NCCL on a GPU, gloo on the dry run), its summary.json."""
    out_dir = work / "run"
    extra, missing = trainer_flags(_run([sys.executable, "-m", "trainer", "--help"], 60)["stdout"],
                                   dry_run=device.type != "cuda")
    cmd = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node=1", "-m", "trainer",
           "--data", url, "--model", "resnet", "--max-steps", str(sizes.train_steps), "--epochs", "1000",
           "--batch-size", str(sizes.train_batch), "--image-size", str(sizes.image_size),
           "--num-workers", str(sizes.num_workers), "--log-every", str(max(1, sizes.train_steps // 3)),
           "--device", device.type, "--out", str(out_dir), "--resume", "none", "--dist-timeout-s", "60", *extra]
    if "--model" in extra:  # the race's model replaces the toy ResNet (the first --model given)
        del cmd[cmd.index("--model"): cmd.index("--model") + 2]
    if not Path(cmd[0]).exists():
        cmd[:1] = [sys.executable, "-m", "torch.distributed.run"]
    run = _run(cmd, timeout_s, env={"OMP_NUM_THREADS": "1"})
    summary_path = out_dir / "summary.json"
    if run["returncode"] != 0 or not summary_path.exists():
        return {"error": f"trainer exit {run['returncode']}: {run['stderr'][-1500:]}"}
    summary = json.loads(summary_path.read_text())
    keys = ("steps", "samples_per_s", "wait_share", "stage_share", "hidden_load_share", "slowest_stage", "verdict")
    return {"command": " ".join(["torchrun", *cmd[cmd.index("--standalone"):]]), "missing_flags": missing,
            **{k: summary.get(k) for k in keys}}


def _run(cmd: list[str], timeout_s: float, *, check: bool = False, env: dict[str, str] | None = None) -> dict[str, Any]:
    full_env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **(env or {})}
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=full_env)
    except subprocess.TimeoutExpired as exc:
        if check:
            raise RuntimeError(f"{' '.join(cmd[:6])} ... took over {timeout_s:.0f} s") from None
        return {"returncode": 124, "stdout": str(exc.stdout or ""), "stderr": f"timed out after {timeout_s:.0f} s"}
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... exited {done.returncode}: {done.stderr[-1500:]}")
    return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def run_all(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Every step in order, each one's failure recorded rather than fatal, within BUDGET_S."""
    sizes, started = Sizes(args.dry_run), time.monotonic()
    res: dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                           "dry_run": args.dry_run, "env": environment(device), "seconds": {}}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        steps = (("tests", lambda: gpu_tests(sizes, sizes.step_timeout_s)),
                 ("dataset", lambda: make_dataset(work, sizes)),
                 ("decode", lambda: decode_step(res["dataset"], sizes, device)),
                 ("race", lambda: race_step(res["dataset"], work, sizes, device, args.dry_run)),
                 ("train", lambda: train_step(res["dataset"], work, sizes, device, sizes.step_timeout_s)))
        for name, step in steps:
            t0 = time.monotonic()
            print(f"gpu_check: {name} ...", flush=True)
            try:
                res[name] = step()
            except Exception as exc:  # noqa: BLE001 - report every step, whatever one of them does
                res[name] = {"error": f"{type(exc).__name__}: {exc}"}
            res["seconds"][name] = round(time.monotonic() - t0, 1)
            if isinstance(res.get("dataset"), dict):
                break  # no dataset: the decode and training steps cannot run
    res["seconds"]["total"] = round(time.monotonic() - started, 1)
    res["within_budget"] = res["seconds"]["total"] <= BUDGET_S
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true",
                        help="run every step on CPU twins at tiny sizes (no GPU needed): checks the script itself")
    parser.add_argument("--results", default=None,
                        help="where to write the report (default: benchmarks/results_gpu.md; the dry run: "
                             "out/gpu_check_dry_run.md, so it never overwrites a real run's figures)")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible to torch (torch.cuda.is_available() is False; torch "
              f"{torch.__version__}, built for CUDA {torch.version.cuda or 'none'}): run it on the GPU machine, or "
              "use --dry-run to check the script on CPU twins", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if not args.dry_run else torch.device("cpu")
    results = Path(args.results or (ROOT / ("out/gpu_check_dry_run.md" if args.dry_run else
                                            "benchmarks/results_gpu.md")))
    res = run_all(args, device)
    from benchmarks.gpu_report import render

    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(render(res))
    print(f"gpu_check: {res['seconds']['total']:.0f} s, results in {results}", flush=True)
    failed = [k for k in ("tests", "decode", "race", "train") if isinstance(res.get(k), dict) and "error" in res[k]]
    if failed:
        print(f"gpu_check: steps that failed: {', '.join(failed)} (see {results})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
