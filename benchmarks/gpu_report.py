"""benchmarks/results_gpu.md from gpu_check's results: the GPU, the date, every figure."""

from __future__ import annotations

import json
from typing import Any


def _decode_lines(dec: dict[str, Any]) -> list[str]:
    if "error" in dec:
        return [f"Failed: {dec['error']}"]
    per_core = dec["cpu_per_core"]
    rows = [(f"{dec['decoder']}: decode only", dec["decode_per_s"]),
            (f"{dec['decoder']}: decode + RRC crop + resize 224 + flip", dec["decode_crop_per_s"]),
            *dec["dali"].items()]
    return ["| decode path (batch of the loader's RAW stream) | images/s | CPU cores of our DECODE it equals |",
            "|---|---:|---:|",
            *[f"| {name} | {rate:,.0f} | {rate / per_core:.1f} |" for name, rate in rows],
            "", f"Our CPU decode (CpuDecoder, region decode where built, RRC 224 + flip) on one core of this machine: "
                f"{per_core:,.0f} images per CPU-second." + ("" if dec["dali"] else " DALI is not importable here: "
                                                               "no DALI rows.")]


def _train_lines(train: dict[str, Any]) -> list[str]:
    if "error" in train:
        return [f"Failed: {train['error']}"]
    share = train.get("stage_share") or {}
    return [f"`{train['command']}`", "",
            f"- {train['steps']} steps, {train['samples_per_s']:,.0f} samples/s, data wait "
            f"{train['wait_share']:.0%} of step time, loading hidden {train['hidden_load_share']:.0%}, "
            f"slowest stage {train['slowest_stage']}",
            "- step time by stage: " + ", ".join(f"{k} {v:.0%}" for k, v in share.items()),
            f"- verdict: {train['verdict']}"]


def render(res: dict[str, Any]) -> str:
    env = res["env"]
    title = "GPU check (DRY RUN on CPU twins: no GPU figures)" if res["dry_run"] else f"GPU check: {env.get('gpu')}"
    tests = res.get("tests", {})
    out = [f"# {title}", "", f"Run {res['date']} by `python -m benchmarks.gpu_check{' --dry-run' if res['dry_run'] else ''}`"
           f" in {res['seconds']['total']:.0f} s ({'within' if res['within_budget'] else 'OVER'} the 4-minute budget; "
           "per step: " + ", ".join(f"{k} {v:.0f} s" for k, v in res["seconds"].items() if k != "total") + ").", "",
           "## Environment", "", "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in env.items()], "",
           "## GPU-only tests", "", f"`{tests.get('command', '')}`: {tests.get('summary', tests.get('error', ''))}",
           *[f"- {line}" for line in tests.get("skips", [])],
           *[f"- {line}" for line in tests.get("failures", [])], "",
           "## Decode", "", *_decode_lines(res.get("decode", {"error": "not run (no dataset)"})), "",
           "## Training (ResNet, 1 GPU, NCCL, torchrun)", "",
           *_train_lines(res.get("train", {"error": "not run (no dataset)"})), "",
           "<details><summary>raw results</summary>", "", "```json", json.dumps(res, indent=1, default=str), "```",
           "", "</details>", ""]
    return "\n".join(out)
