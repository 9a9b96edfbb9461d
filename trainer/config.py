"""The trainer's one config: a frozen dataclass filled from a TOML file, then CLI flags.

Every field is a flag (`--batch-size` for `batch_size`); `--config FILE` reads the same names
from TOML (top level, or a [trainer] table). Unknown keys are an error, never silently ignored.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from trainer.redaction import scrub, secrets_of

OPTIMIZERS = ("sgd", "adamw")
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")  # or package.module:function returning (state, hook)
DECODES = ("cpu", "dali")  # the trainer needs decoded images
LABEL_SPACES = ("same", "union")  # or --label-map FILE (dataio/loader/labels.py)


@dataclass(frozen=True, slots=True)
class DataSource:
    """One training dataset of a mixture and its weight (shares are weights / their sum)."""

    url: str
    weight: float = 1.0

    def __str__(self) -> str:
        return self.url if self.weight == 1.0 else f"{self.url}={self.weight:g}"


def parse_data_spec(spec: str) -> DataSource:
    """'URL=WEIGHT' (the last '=' splits) or 'URL' (weight 1). An '=' inside a URL's query
    (synthetic:?samples=96) is the URL's own: a weight then needs its own '=' after it."""
    url, sep, tail = spec.rpartition("=")
    query_key = spec[max(spec.rfind("?"), spec.rfind("&")) + 1:]
    if not sep or ("?" in spec and query_key.count("=") == 1):
        return DataSource(spec)
    try:
        weight = float(tail)
    except ValueError:
        return DataSource(spec)  # an '=' of the URL itself (s3://b/k=v/data)
    return DataSource(url, weight)


def _data_sources(value: Any) -> tuple[DataSource, ...]:
    """--data given once or repeated, or TOML's data = "..." / ["..."] / [[data]] url=, weight=."""
    items = [value] if isinstance(value, (str, DataSource, Mapping)) else list(value)
    out = []
    for item in items:
        if isinstance(item, DataSource):
            out.append(item)
        elif isinstance(item, str):
            out.append(parse_data_spec(item))
        elif isinstance(item, Mapping):
            unknown = sorted(set(item) - {"url", "weight"})
            if unknown or not isinstance(item.get("url"), str):
                raise ValueError(f"a [[data]] table takes url (a string) and weight, got {dict(item)!r}")
            weight = item.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise ValueError(f"[[data]] weight must be a number, got {weight!r} for {item['url']}")  # noqa: TRY004
            out.append(DataSource(item["url"], float(weight)))
        else:
            raise ValueError(f"--data takes URL or URL=WEIGHT, got {item!r}")  # noqa: TRY004
    for source in out:
        if not source.url or not source.weight >= 0 or source.weight == float("inf"):
            raise ValueError(f"--data {source}: needs a URL and a finite weight >= 0")
    return tuple(out)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """Everything one training run needs; validated on construction."""

    # Train dataset URL (a shardify prefix) or synthetic:?samples=...; several weighted ones
    # (--data URL=WEIGHT repeated, TOML [[data]]) are held as a tuple of DataSource.
    data: str | tuple[DataSource, ...] = ""
    val_data: str = ""  # validation dataset URL; empty: no validation
    model: str = "resnet"  # registry name (resnet, mlp) or package.module:function
    num_classes: int = 0  # 0: from the dataset (manifest label names / synthetic classes)
    epochs: int = 1
    max_steps: int = 0  # 0: no limit; else stop after this many optimizer steps in total
    batch_size: int = 32  # per rank, per micro-step
    grad_accum: int = 1  # micro-steps per optimizer step
    lr: float = 0.1
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 5e-4
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0  # cosine decays to lr * min_lr_ratio
    features: str = ""  # comma-separated numeric columns: train on table rows instead of images
    image_size: int = 32
    augment: bool = True  # train split: random resized crop + flip; --no-augment: resize + centre crop
    num_workers: int = 2
    decode: str = "cpu"
    seed: int = 0
    log_every: int = 10  # optimizer steps between gathered reports
    out: str = "runs/latest"  # output directory: metrics.jsonl, trace.json, chart, summary
    checkpoint_dir: str = ""  # local path or fsspec URL; empty: OUT/checkpoints
    checkpoint_every: int = 0  # optimizer steps; 0: only at epoch end
    keep_checkpoints: int = 3
    resume: str = "auto"  # auto | none | PATH-or-URL of one checkpoint
    record_keys: bool = False  # write OUT/keys-rankR.jsonl: sample keys of every committed step
    dist_timeout_s: float = 120.0  # process-group timeout: a broken rank never hangs the rest
    device: str = "auto"  # auto | cpu | cuda
    trace_steps: int = 2000  # steps per rank kept for trace.json and the chart
    live: bool = True  # live table on rank 0 when stdout is a terminal
    s3_endpoint_url: str = ""
    s3_region: str = ""
    storage_config: str = ""  # TOML with an [s3] table (endpoint_url, key, secret, region)
    num_threads: int = 0  # torch intra-op threads per rank; 0: torch's default
    bucket_cap_mb: float = 25.0  # DDP gradient bucket size
    comm_hook: str = "none"  # none | fp16 | bf16 | powersgd | package.module:function
    price_per_hour: float = 0.0  # $ per rank (accelerator) per hour; 0: no cost lines
    tensorboard: str = ""  # directory for TensorBoard event files (rank 0); empty: none
    # --- labels of the --data sources: one label space (dataio/loader/labels.py) ---
    label_space: str = "same"  # same: names agree by index | union: merged by name, sorted
    label_map: str = ""  # JSON file {source: {name: index}} or {name: index}; empty: none
    spike_factor: float = 3.0  # a step whose loss exceeds this x the running median is a spike; 0: off
    spike_sample_losses: bool = False  # keep per-sample losses so a spike names its worst samples
    mix_schedule: str = ""  # mixture weights over the run (dataio/plan/schedule.py syntax); empty: fixed weights
    epoch_samples: int = 0  # a mixture's epoch in samples (sequences for --model gpt); 0: the sources' sizes summed
    # --- skip on resume (trainer/skipping.py): dropped from the rest of the run, kept in the loader state ---
    skip_steps: str = ""  # A:B optimizer steps (as the run that trained them numbered them); empty: none
    skip_samples: str = ""  # file of sample keys or global ids, one a line; empty: none
    # --- --model gpt on token datasets (trainer/gpt.py) ---
    seq_len: int = 256
    packing: str = "concat"
    tokenizer: str = ""  # the dataset's tokenizer file, checked by hash; empty: not checked
    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    doc_masking: bool = True
    peak_flops: float = 0.0  # 0: the GPU table (H100/H200/A100/L4), none on CPU
    context_length: int = 32  # --model clip: caption tokens per pair (trainer/clip.py); --tokenizer tokenizes them

    def __post_init__(self) -> None:
        positive = ("epochs", "batch_size", "grad_accum", "image_size", "log_every", "keep_checkpoints",
                    "trace_steps", "seq_len", "n_layer", "n_embd", "n_head")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"--{_flag(name)} must be >= 1, got {getattr(self, name)}")
        for name in ("max_steps", "warmup_steps", "checkpoint_every", "num_workers", "num_classes", "num_threads",
                     "epoch_samples"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{_flag(name)} must be >= 0, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if self.weight_decay < 0 or not 0 <= self.min_lr_ratio <= 1 or self.momentum < 0:
            raise ValueError("--weight-decay and --momentum must be >= 0, --min-lr-ratio in [0, 1]")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"--optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.decode not in DECODES:
            raise ValueError(f"--decode must be one of {DECODES}, got {self.decode!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--device must be auto, cpu or cuda, got {self.device!r}")
        if not self.bucket_cap_mb > 0 or self.price_per_hour < 0:
            raise ValueError(f"--bucket-cap-mb must be > 0 and --price-per-hour >= 0, got {self.bucket_cap_mb} "
                             f"and {self.price_per_hour}")
        if self.comm_hook not in COMM_HOOKS and ":" not in self.comm_hook:
            raise ValueError(f"--comm-hook must be one of {COMM_HOOKS} or package.module:function, "
                             f"got {self.comm_hook!r}")
        if not self.spike_factor >= 0:
            raise ValueError(f"--spike-factor must be >= 0 (0: off), got {self.spike_factor}")
        if self.packing not in ("concat", "aligned") or self.peak_flops < 0:
            raise ValueError(f"--packing must be concat or aligned (got {self.packing!r}), --peak-flops >= 0")
        if not self.dist_timeout_s > 0:
            raise ValueError("--dist-timeout-s must be > 0")
        _check_labels_flags(self.label_space, self.label_map)
        sources = _data_sources(self.data) if self.data else ()
        plain = len(sources) == 1 and sources[0].weight == 1.0
        object.__setattr__(self, "data", sources[0].url if plain else sources)
        if len(sources) > 1 and any(s.url.startswith("synthetic:") for s in sources):
            raise ValueError("--data synthetic: cannot be mixed with other datasets")
        if self.mix_schedule:
            _check_schedule(self.mix_schedule, sources)
        if self.epoch_samples and len(sources) < 2:
            raise ValueError("--epoch-samples sets a mixture's epoch: give two or more --data sources")
        if self.skip_steps:
            from dataio.loader.skips import parse_steps

            parse_steps(self.skip_steps)
        if not self.data:
            raise ValueError("--data is required: a dataset URL made by `shardify`, e.g. --data runs/digits/train")
        if not self.out:
            raise ValueError("--out must name a directory")

    @property
    def sources(self) -> tuple[DataSource, ...]:
        """The training datasets, one or several, with their weights."""
        return self.data if isinstance(self.data, tuple) else (DataSource(self.data),)

    @property
    def data_label(self) -> str:
        """--data for messages: the URL, or the mixture as URL=WEIGHT + ..., credentials redacted."""
        return scrub(" + ".join(str(s) for s in self.sources), config_secrets(self))

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(f.strip() for f in self.features.split(",") if f.strip())

    @property
    def checkpoint_url(self) -> str:
        return self.checkpoint_dir or f"{self.out.rstrip('/')}/checkpoints"


def _check_schedule(text: str, sources: tuple[DataSource, ...]) -> None:
    """ValueError unless --mix-schedule parses and gives one weight per --data source (two or more)."""
    from dataio.plan.schedule import parse_schedule

    pieces = parse_schedule(text)
    if len(sources) < 2 or len(pieces[0].weights) != len(sources):
        raise ValueError(f"--mix-schedule gives {len(pieces[0].weights)} weights per piece; it needs one per --data "
                         f"source, and two or more sources (got {len(sources)})")


def _check_labels_flags(label_space: str, label_map: str) -> None:
    if label_space not in LABEL_SPACES:
        raise ValueError(f"--label-space must be one of {LABEL_SPACES}, got {label_space!r}")
    if label_map and label_space != "same":
        raise ValueError("give --label-space union or --label-map FILE, not both: the map fixes the space itself")


def _flag(name: str) -> str:
    return name.replace("_", "-")


_HELP = {
    "data": "train dataset URL (local path, s3://..., or synthetic:?samples=N&classes=C&delay_s=S); repeat "
            "as --data URL=WEIGHT to train on a weighted mixture (the last '=' splits; no weight: 1)",
    "val_data": "held-out dataset URL (its own manifest); every sample seen once per validation; empty: none",
    "context_length": "--model clip: tokens per caption (cut keeping the end token, padded); the captions are "
                      "tokenized in the loader's workers with --tokenizer",
    "model": "registry name (resnet, mlp, gpt: a decoder-only transformer on a token dataset, clip: image-text "
             "pairs, zero-shot validated on a labelled --val-data) or a factory "
             "package.module:function(num_classes=, image_size=)",
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
    "decode": f"image decode: one of {DECODES} (dali: NVIDIA DALI, on the GPU when there is one)",
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
    "epoch_samples": "a mixture's epoch in samples (sequences for --model gpt); 0: the --data sources' sizes "
                     "summed. To add a source on resume, append it as the last --data with weight 0 in every "
                     "--mix-schedule piece up to the one in progress, and pass the saved epoch's length here",
    "skip_steps": "A:B: drop the samples of optimizer steps A through B (as spikes.jsonl numbers them; the plan "
                  "and a checkpoint saved at step B or later say which samples, at the topology that ran them) from "
                  "the rest of the run and every later epoch (which shrinks by their count); the state keeps skipping "
                  "on later resumes. Resume from a checkpoint before A with --resume PATH to train past them",
    "skip_samples": "file of sample keys (as `shardify which` and spikes.jsonl print them) or global sample ids, one "
                    "a line (# comments): dropped from the rest of the run and every later epoch, like --skip-steps",
    "label_map": "JSON file giving the label space explicitly: {\"SOURCE\": {\"NAME\": INDEX}} (SOURCE: a --data URL "
                 "or the last part of its path) or {\"NAME\": INDEX} for every source",
    "seq_len": "--model gpt: tokens per sequence (the model's context; batches carry seq_len + 1 for the labels)",
    "packing": "--model gpt: concat (documents back to back, cut every seq_len) or aligned (each sequence starts "
               "at a document start; the rest padded and masked)",
    "tokenizer": "--model gpt: the dataset's tokenizer file; another one (by hash) is refused before training",
    "n_layer": "--model gpt: transformer blocks",
    "n_embd": "--model gpt: width (a multiple of --n-head)",
    "n_head": "--model gpt: attention heads",
    "doc_masking": "--model gpt: attend only within a document (block-diagonal causal mask from the batch's doc_ids)",
    "peak_flops": "--model gpt: peak FLOP/s per rank for the MFU estimate; 0: known GPUs (H100, H200, A100, L4), "
                  "else no MFU",
}


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser with one flag per TrainConfig field; defaults are None (= not given)."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="DDP trainer with a per-step, per-rank data-wait vs compute report. "
        "Run with torchrun --nproc_per_node=N -m trainer [flags].",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        argument_default=None,
    )
    parser.add_argument("--config", default=None, help="TOML file with any of the flags below (as snake_case keys)")
    defaults = TrainConfig.__dataclass_fields__
    for f in fields(TrainConfig):
        default = defaults[f.name].default
        help_text = f"{_HELP.get(f.name, '')} (default: {default!r})".strip()
        if f.name == "data":  # repeatable: a mixture of weighted datasets
            parser.add_argument("--data", dest="data", action="append", default=None, metavar="URL[=WEIGHT]",
                                help=help_text)
        elif isinstance(default, bool):
            parser.add_argument(f"--{_flag(f.name)}", dest=f.name, action=argparse.BooleanOptionalAction,
                                default=None, help=help_text)
        else:
            kind = type(default)
            parser.add_argument(f"--{_flag(f.name)}", dest=f.name, type=kind, default=None,
                                metavar=f.name.upper(), help=help_text)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
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
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ValueError(f"unknown keys {unknown} in config file {path!r}; run `python -m trainer --help` for the list")
    for key, value in table.items():
        if key == "data":  # a URL, a list of URL=WEIGHT, or [[data]] tables; TrainConfig checks them
            continue
        want = type(TrainConfig.__dataclass_fields__[key].default)
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
    return TrainConfig(**values)


def config_secrets(cfg: TrainConfig) -> tuple[str, ...]:
    """The credentials the config's own URLs carry (--data s3://KEY:SECRET@..., --checkpoint-dir, ...)."""
    texts = [v for f in dataclasses.fields(cfg) if isinstance(v := getattr(cfg, f.name), str)]
    return secrets_of([*texts, *(s.url for s in cfg.sources)])


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config as plain data, for metrics.jsonl and checkpoints: URLs redacted (s3://***@bucket/...),
    so no credential is ever saved; a resumed run takes them from its own flags or environment."""
    out = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    if isinstance(cfg.data, tuple):
        out["data"] = [{"url": s.url, "weight": s.weight} for s in cfg.data]
    return scrub(out, config_secrets(cfg))
