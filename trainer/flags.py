"""The trainer's command line: one flag per TrainConfig option (flat names), TOML files, parse_config.

Flags come in argument groups, one per config group; the loader's come from its own options
(trainer/loader_options.py), so a new loader option is a flag without a line here.
"""

from __future__ import annotations

import argparse
import tomllib
from typing import Any

from trainer.config import COMM_HOOKS, FLAT, GROUPS, OPTIMIZERS, TrainConfig, flag_of
from trainer.loader_options import NUM_WORKERS, OPTIONS, loader_help

# Each option's scalar kind (what a flag and a TOML value parse as) and whether None may be given.
KINDS: dict[str, type] = {o.name: o.kind for o in (NUM_WORKERS, *OPTIONS)}
_LOADER_HELP = loader_help()
_HELP = {
    "data": "train dataset URL (local path, s3://..., or synthetic:?samples=N&classes=C&delay_s=S); repeat "
            "as --data URL=WEIGHT to train on a weighted mixture (the last '=' splits; no weight: 1)",
    "val_data": "held-out dataset URL (its own manifest); every sample seen once per validation; empty: none",
    "model": "registry name (resnet, mlp, gpt: a decoder-only transformer on a token dataset, clip: image-text "
             "pairs, zero-shot validated on a labelled --val-data; clip_vit: its image tower a small ViT, needs "
             "torchvision), a torchvision "
             "classification model (resnet50, vit_b_16, ...; needs torchvision) or a factory "
             "package.module:function(num_classes=, image_size=); the dataset's manifest must fit it (gpt: tokens)",
    "precision": "autocast: bf16, fp16 (with a gradient scaler), fp32 (none), or auto (bf16 on CUDA, fp32 on CPU)",
    "channels_last": "images and the model in channels-last (NHWC) memory order: faster convolutions on GPUs",
    "compile": "torch.compile the model (the first steps compile it: slower, then faster)",
    "num_classes": "classes of the classifier; 0: from the manifest's label names",
    "epochs": "passes over the training set",
    "max_steps": "stop after this many optimizer steps in total (0: no limit)",
    "batch_size": "samples per rank per micro-step",
    "grad_accum": "micro-steps per optimizer step (no all-reduce on the others)",
    "lr": "peak learning rate (after warmup)",
    "optimizer": f"one of {OPTIMIZERS}",
    "momentum": "SGD momentum (Nesterov when > 0)",
    "weight_decay": "weight decay (decoupled for adamw)",
    "warmup_steps": "linear warmup, in optimizer steps of the first start (converted to samples)",
    "min_lr_ratio": "cosine decays to lr x this",
    "features": "comma-separated numeric columns (Parquet tables): rows of these go to the model, no image decode",
    "image_size": "side of the square images fed to the model",
    "augment": "random resized crop + flip on training images; use --no-augment for tiny images (8x8 digits)",
    "num_workers": "loader worker processes per rank",
    "decode": "image decode, as make_loader's: cpu (in the workers), gpu (RAW batches decoded on the rank's GPU: "
              "nvImageCodec, else nvJPEG, else the CPU), auto (CPU workers and the GPU together on a CUDA device, "
              "the split from measured rates; else cpu) or dali (NVIDIA DALI)",
    "seed": "seed of the data order, weights and every RNG (a run repeats exactly)",
    "log_every": "optimizer steps between reports gathered from all ranks",
    "out": "output directory: metrics.jsonl, trace.json, steps.png, summary.json (rank 0)",
    "checkpoint_dir": "local path or fsspec URL (s3://...) for checkpoints; empty: OUT/checkpoints",
    "checkpoint_every": "optimizer steps between checkpoints (0: only at epoch end)",
    "keep_checkpoints": "newest checkpoints kept",
    "resume": "auto: newest complete checkpoint in --checkpoint-dir; none; or one checkpoint path/URL",
    "record_keys": "write OUT/keys-rankR.jsonl: the sample keys of every committed step (audits exactly-once)",
    "dist_timeout_s": "torch.distributed timeout: a rank that breaks stops the others, and a rank that stops "
                      "responding is named, within this",
    "device": "auto (cuda:LOCAL_RANK when CUDA is present, else cpu), cpu or cuda",
    "trace_steps": "steps per rank kept for trace.json and steps.png",
    "live": "redraw the table in place on a terminal (rank 0)",
    "s3_endpoint_url": "S3 endpoint (else [s3] of --storage-config, else AWS_ENDPOINT_URL)",
    "s3_region": "S3 region (else AWS_REGION)",
    "storage_config": "TOML file with an [s3] table: endpoint_url, key, secret, region, anon",
    "num_threads": "torch threads per rank (set OMP_NUM_THREADS too); 0: torch's default (all cores)",
    "bucket_cap_mb": "DDP gradient bucket size: fewer, bigger all-reduces vs earlier overlap",
    "comm_hook": f"gradient all-reduce: one of {COMM_HOOKS} (torch's DDP hooks) or package.module:function "
                 "returning (state, hook); still timed for the exposed/overlapped split",
    "price_per_hour": "$ per rank (accelerator) per hour: adds $/epoch, $/1000 samples and the wasted share",
    "tensorboard": "directory for TensorBoard scalars of every report interval (needs the tensorboard package)",
    "label_space": "one label space for the --data sources: same (their label names must agree by index; else "
                   "refused) or union (merged by name into the sorted union; each source's labels remapped)",
    "spike_factor": "a step whose loss on a rank exceeds this many times the running median of that rank's loss "
                    "(last 200 steps, from step 20) is a spike: listed in the report, metrics.jsonl and spikes.jsonl "
                    "with its ranks and the keys of its samples, computed from the plan; 0: off",
    "spike_sample_losses": "also keep each step's per-sample losses, so a spike names its worst samples (a little "
                           "extra work per step)",
    "mix_schedule": "mixture weights that change over the run, by samples since its start (across epochs): "
                    "'0.7,0.3@1000000; 0.5,0.5' is 0.7/0.3 for the first 1M samples, then 0.5/0.5; a piece "
                    "FROM~TO@SAMPLES/PIECES ramps linearly in PIECES steps (one weight per --data source, in order; "
                    "pieces after the epoch in progress may change on resume, earlier ones not)",
    "epoch_samples": "a mixture's epoch in samples (sequences for --model gpt); not given: the --data sources' "
                     "sizes summed. To add a source on resume, append it as the last --data with weight 0 in every "
                     "--mix-schedule piece up to the one in progress, and pass the saved epoch's length here",
    "skip_steps": "A:B: drop the samples of optimizer steps A through B (as spikes.jsonl numbers them; the plan "
                  "and a checkpoint saved at step B or later say which samples, at the topology that ran them) from "
                  "the rest of the run and every later epoch (which shrinks by their count); the state keeps skipping "
                  "on later resumes. Resume from a checkpoint before A with --resume PATH to train past them",
    "skip_samples": "file of sample keys (as `shardify which` and spikes.jsonl print them) or global sample ids, one "
                    "a line (# comments): dropped from the rest of the run and every later epoch, like --skip-steps",
    "label_map": "JSON file giving the label space explicitly: {\"SOURCE\": {\"NAME\": INDEX}} (SOURCE: a --data URL "
                 "or the last part of its path) or {\"NAME\": INDEX} for every source",
    "seq_len": "token datasets: tokens per sequence (the model's context; batches carry seq_len + 1 for the labels)",
    "packing": "token datasets: concat (documents back to back, cut every seq_len) or aligned (each sequence starts "
               "at a document start; the rest padded and masked)",
    "tokenizer": "token datasets: the dataset's tokenizer file; another one (by hash) is refused before training "
                 "(--model clip: the captions' tokenizer)",
    "context_length": "--model clip: tokens per caption (cut keeping the end token, padded; default 32), tokenized "
                      "in the loader's workers with --tokenizer",
    "n_layer": "--model gpt: transformer blocks",
    "n_embd": "--model gpt: width (a multiple of --n-head)",
    "n_head": "--model gpt: attention heads",
    "doc_masking": "--model gpt: attend only within a document (block-diagonal causal mask from the batch's doc_ids)",
    "peak_flops": "--model gpt: peak FLOP/s per rank for the MFU estimate; 0: known GPUs (H100, H200, A100, L4), "
                  "else no MFU",
}


def _default(name: str) -> Any:
    field = GROUPS[FLAT[name]].__dataclass_fields__[name]
    return field.default_factory() if callable(field.default_factory) else field.default


def _kind(name: str) -> type:
    return KINDS.get(name) or type(_default(name))


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser with one flag per option, grouped by concern; defaults are None (= not given)."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="DDP trainer with a per-step, per-rank data-wait vs compute report. "
        "Run with torchrun --nproc_per_node=N -m trainer [flags].",
        argument_default=None,
    )
    parser.add_argument("--config", default=None, help="TOML file with any of the flags below (as snake_case keys)")
    sections = {group: parser.add_argument_group(f"{group} options") for group in GROUPS}
    for name, group in FLAT.items():
        default, section = _default(name), sections[group]
        text = _HELP.get(name) or f"{_LOADER_HELP.get(name, name)} (make_loader's {name}; docs/guides/loading.md)"
        help_text = f"{text} (default: {default!r})"
        if name == "data":  # repeatable: a mixture of weighted datasets
            section.add_argument("--data", dest="data", action="append", default=None, metavar="URL[=WEIGHT]",
                                 help=help_text)
        elif _kind(name) is bool:
            section.add_argument(f"--{flag_of(name)}", dest=name, action=argparse.BooleanOptionalAction,
                                 default=None, help=help_text)
        else:
            section.add_argument(f"--{flag_of(name)}", dest=name, type=_kind(name), default=None,
                                 metavar=name.upper(), help=help_text)
    return parser


def load_toml(path: str) -> dict[str, Any]:
    """Keys of a TOML config file (top level or [trainer]); unknown keys raise ValueError."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"config file {path!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path!r} is not valid TOML: {exc}") from None
    table = dict(raw.get("trainer", {}))
    table.update({k: v for k, v in raw.items() if k not in ("trainer", "s3", "gcs", "azure")})  # storage tables
    unknown = sorted(set(table) - set(FLAT))
    if unknown:
        raise ValueError(f"unknown keys {unknown} in config file {path!r}; run `python -m trainer --help` for the list")
    for key, value in table.items():
        if key == "data":  # a URL, a list of URL=WEIGHT, or [[data]] tables; TrainConfig checks them
            continue
        want = _kind(key)
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            table[key] = float(value)
        elif not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise ValueError(f"{key!r} in {path!r} must be {want.__name__}, got {value!r}")
    return table


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """TrainConfig from defaults < TOML file < flags. Bad flags raise ValueError (not SystemExit)."""
    parser = build_parser()
    parser.exit_on_error = False
    try:
        ns, extra = parser.parse_known_args(argv)
    except argparse.ArgumentError as exc:
        raise ValueError(f"bad flag: {exc}") from None
    if extra:
        raise ValueError(f"unknown flags {extra}; run `python -m trainer --help` for the list")
    values: dict[str, Any] = load_toml(ns.config) if ns.config else {}
    values.update({k: v for k, v in vars(ns).items() if v is not None and k != "config"})
    return TrainConfig.from_options(**values)
