"""benchmarks/results_gpu.md from gpu_check's results: the GPU, the date, every figure."""

from __future__ import annotations

import json
from typing import Any


def _decode_lines(dec: dict[str, Any]) -> list[str]:
    if "error" in dec:
        return [f"Failed: {dec['error']}"]
    per_core = dec["cpu_per_core"]
    ours = dec.get("gpu_decoder", {"error": "not run"})
    mine = [] if "error" in ours else [(f"the loader's GPU decoder, {ours['codec']}: decode + RRC crop + resize 224 "
                                        "+ flip (one batched kernel)", ours["per_s"])]
    rows = [(f"{dec['decoder']}: decode only", dec["decode_per_s"]),
            (f"{dec['decoder']}: decode + RRC crop + resize 224 + flip", dec["decode_crop_per_s"]),
            *mine, *dec["dali"].items()]
    return ["| decode path (batch of the loader's RAW stream) | images/s | CPU cores of our DECODE it equals |",
            "|---|---:|---:|",
            *[f"| {name} | {rate:,.0f} | {rate / per_core:.1f} |" for name, rate in rows],
            "", f"Our CPU decode (CpuDecoder, region decode where built, RRC 224 + flip) on one core of this machine: "
                f"{per_core:,.0f} images per CPU-second." + ("" if dec["dali"] else " DALI is not importable here: "
                                                               "no DALI rows.")] + (
                [f"The loader's GPU decoder did not run: {ours['error']}"] if "error" in ours else [])


def _train_lines(train: dict[str, Any]) -> list[str]:
    if "error" in train:
        return [f"Failed: {train['error']}"]
    share = train.get("stage_share") or {}
    missing = train.get("missing_flags") or []
    return [f"`{train['command']}`", *([f"(the trainer here lacks {', '.join(missing)}: run without them)"]
                                       if missing else []), "",
            f"- {train['steps']} steps, {train['samples_per_s']:,.0f} samples/s, data wait "
            f"{train['wait_share']:.0%} of step time, loading hidden {train['hidden_load_share']:.0%}, "
            f"slowest stage {train['slowest_stage']}",
            "- step time by stage: " + ", ".join(f"{k} {v:.0%}" for k, v in share.items()),
            f"- verdict: {train['verdict']}"]


def _race_lines(race: dict[str, Any], train: dict[str, Any], dry_run: bool) -> list[str]:
    if "error" in race:
        return [f"Failed: {race['error']}"]
    from benchmarks.gpu_race import TARGETS

    names = {"synthetic": "synthetic batches already on the GPU (the ceiling)", "imagefolder": race["imagefolder"],
             "cpu": 'make_loader(decode="cpu")', "gpu": 'make_loader(decode="gpu")', "auto": 'make_loader(decode="auto")'}
    out = [f"{race['model']}, {race['precision']}, channels_last, batch {race['batch_size']}, "
           f"{race['num_workers']} workers; one training loop for every row.", "",
           "| input | samples/s | share of the ceiling | target |", "|---|---:|---:|---:|"]
    for key, row in race["rows"].items():
        target = f"{TARGETS[key]:.2f}" if key in TARGETS else ""
        if "error" in row:
            out.append(f"| {names[key]} | failed: {row['error'][:160]} | | {target} |")
            continue
        out.append(f"| {names[key]} | {row['samples_per_s']:,.0f} | {row.get('share', 0):.2f} | {target} |")
    ceiling = race["rows"].get("synthetic", {}).get("samples_per_s")
    if ceiling and "samples_per_s" in train:
        out.append(f"| the torchrun trainer (below) | {train['samples_per_s']:,.0f} | "
                   f"{train['samples_per_s'] / ceiling:.2f} | 0.90 |")
    for key in ("gpu", "auto"):
        stats = race["rows"].get(key, {}).get("gpu_decode")
        if stats:
            out += ["", f"- `{key}`: " + ", ".join(f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v}"
                                                      for k, v in stats.items())]
    if dry_run:
        out += ["", "Dry run: CPU twins and a small model; no figure here says anything about a GPU."]
    return out


def render(res: dict[str, Any]) -> str:
    env = res["env"]
    title = "GPU check (DRY RUN on CPU twins: no GPU figures)" if res["dry_run"] else f"GPU check: {env.get('gpu')}"
    tests = res.get("tests", {})
    out = [f"# {title}", "", f"Run {res['date']} by `python -m benchmarks.gpu_check{' --dry-run' if res['dry_run'] else ''}`"
           f" in {res['seconds']['total']:.0f} s ({'within' if res['within_budget'] else 'OVER'} the 5-minute budget; "
           "per step: " + ", ".join(f"{k} {v:.0f} s" for k, v in res["seconds"].items() if k != "total") + ").", "",
           "## Environment", "", "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in env.items()], "",
           "## GPU-only tests", "", f"`{tests.get('command', '')}`: {tests.get('summary', tests.get('error', ''))}",
           *[f"- {line}" for line in tests.get("skips", [])],
           *[f"- {line}" for line in tests.get("failures", [])], "",
           "## Decode", "", *_decode_lines(res.get("decode", {"error": "not run (no dataset)"})), "",
           "## The race: each input feeding the same training loop", "",
           *_race_lines(res.get("race", {"error": "not run (no dataset)"}), res.get("train", {}), res["dry_run"]), "",
           "## Training (1 GPU, NCCL, torchrun)", "",
           *_train_lines(res.get("train", {"error": "not run (no dataset)"})), "",
           "<details><summary>raw results</summary>", "", "```json", json.dumps(res, indent=1, default=str), "```",
           "", "</details>", ""]
    return "\n".join(out)
