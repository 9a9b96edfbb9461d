"""The trainer's one config: a frozen dataclass of groups, one per concern, each validated on construction.

The groups: datasets (what to train on), loader (make_loader's own options: trainer/loader_options.py),
network (the model and how it runs), optim (what a step does, how many), checkpoints, reporting and
ranks. Every field is a flag of its own flat name (`--lr` sets optim.lr: trainer/flags.py), and
`cfg.lr` reads it: names are unique across groups. Unknown names are an error, never ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainer.loader_options import LoaderOptions
from trainer.redaction import scrub, secrets_of

OPTIMIZERS = ("sgd", "adamw")
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")  # or package.module:function returning (state, hook)
PRECISIONS = ("auto", "bf16", "fp16", "fp32")  # auto: bf16 autocast on CUDA, fp32 elsewhere
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
class Datasets:
    """What to train and validate on, how their labels meet, and how to reach them."""

    # Train dataset URL (a shardify prefix) or synthetic:?samples=...; several weighted ones
    # (--data URL=WEIGHT repeated, TOML [[data]]) are held as a tuple of DataSource.
    data: str | tuple[DataSource, ...] = ""
    val_data: str = ""  # validation dataset URL; empty: no validation
    features: str = ""  # comma-separated numeric columns: train on table rows instead of images
    augment: bool = True  # train split: random resized crop + flip; --no-augment: resize + centre crop
    label_space: str = "same"  # same: names agree by index | union: merged by name, sorted
    label_map: str = ""  # JSON file {source: {name: index}} or {name: index}; empty: none
    mix_schedule: str = ""  # mixture weights over the run (dataio/plan/schedule.py syntax); empty: fixed weights
    # --- skip on resume (trainer/skipping.py): dropped from the rest of the run, kept in the loader state ---
    skip_steps: str = ""  # A:B optimizer steps (as the run that trained them numbered them); empty: none
    skip_samples: str = ""  # file of sample keys or global ids, one a line; empty: none
    s3_endpoint_url: str = ""
    s3_region: str = ""
    storage_config: str = ""  # TOML with an [s3] table (endpoint_url, key, secret, region)

    def __post_init__(self) -> None:
        _check_labels_flags(self.label_space, self.label_map)
        sources = _data_sources(self.data) if self.data else ()
        plain = len(sources) == 1 and sources[0].weight == 1.0
        object.__setattr__(self, "data", sources[0].url if plain else sources)
        if len(sources) > 1 and any(s.url.startswith("synthetic:") for s in sources):
            raise ValueError("--data synthetic: cannot be mixed with other datasets")
        if self.mix_schedule:
            _check_schedule(self.mix_schedule, sources)
        if self.skip_steps:
            from dataio.loader.skips import parse_steps

            parse_steps(self.skip_steps)
        if not self.data:
            raise ValueError("--data is required: a dataset URL made by `shardify`, e.g. --data runs/digits/train")


@dataclass(frozen=True, kw_only=True, slots=True)
class Network:
    """The model, and how it runs: precision, memory format, compilation."""

    model: str = "resnet"  # registry name (resnet, mlp, gpt), a torchvision model name, or package.module:function
    num_classes: int = 0  # 0: from the dataset (manifest label names / synthetic classes)
    precision: str = "auto"  # autocast dtype: auto (bf16 on CUDA, fp32 elsewhere) | bf16 | fp16 | fp32
    channels_last: bool = False  # images and the model's weights in NHWC memory order
    compile: bool = False  # torch.compile the model
    # --- --model gpt on token datasets (trainer/gpt.py) ---
    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    doc_masking: bool = True

    def __post_init__(self) -> None:
        _positive(self, ("n_layer", "n_embd", "n_head"))
        _not_negative(self, ("num_classes",))
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {PRECISIONS}, got {self.precision!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Optim:
    """What one optimizer step does, and how many there are."""

    epochs: int = 1
    max_steps: int = 0  # 0: no limit; else stop after this many optimizer steps in total
    grad_accum: int = 1  # micro-steps per optimizer step
    lr: float = 0.1
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 5e-4
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0  # cosine decays to lr * min_lr_ratio

    def __post_init__(self) -> None:
        _positive(self, ("epochs", "grad_accum"))
        _not_negative(self, ("max_steps", "warmup_steps"))
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if self.weight_decay < 0 or not 0 <= self.min_lr_ratio <= 1 or self.momentum < 0:
            raise ValueError("--weight-decay and --momentum must be >= 0, --min-lr-ratio in [0, 1]")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"--optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Checkpoints:
    """Where checkpoints go, how often, how many stay, and which one a run resumes."""

    checkpoint_dir: str = ""  # local path or fsspec URL; empty: OUT/checkpoints
    checkpoint_every: int = 0  # optimizer steps; 0: only at epoch end
    keep_checkpoints: int = 3
    resume: str = "auto"  # auto | none | PATH-or-URL of one checkpoint

    def __post_init__(self) -> None:
        _positive(self, ("keep_checkpoints",))
        _not_negative(self, ("checkpoint_every",))


@dataclass(frozen=True, kw_only=True, slots=True)
class Reporting:
    """What the run writes and says: the output directory, the report's interval, spikes, costs."""

    out: str = "runs/latest"  # output directory: metrics.jsonl, trace.json, chart, summary
    log_every: int = 10  # optimizer steps between gathered reports
    trace_steps: int = 2000  # steps per rank kept for trace.json and the chart
    live: bool = True  # live table on rank 0 when stdout is a terminal
    record_keys: bool = False  # write OUT/keys-rankR.jsonl: sample keys of every committed step
    tensorboard: str = ""  # directory for TensorBoard event files (rank 0); empty: none
    price_per_hour: float = 0.0  # $ per rank (accelerator) per hour; 0: no cost lines
    peak_flops: float = 0.0  # 0: the GPU table (H100/H200/A100/L4), none on CPU
    spike_factor: float = 3.0  # a step whose loss exceeds this x the running median is a spike; 0: off
    spike_sample_losses: bool = False  # keep per-sample losses so a spike names its worst samples

    def __post_init__(self) -> None:
        _positive(self, ("log_every", "trace_steps"))
        if self.price_per_hour < 0 or self.peak_flops < 0:
            raise ValueError("--price-per-hour and --peak-flops must be >= 0")
        if not self.spike_factor >= 0:
            raise ValueError(f"--spike-factor must be >= 0 (0: off), got {self.spike_factor}")
        if not self.out:
            raise ValueError("--out must name a directory")


@dataclass(frozen=True, kw_only=True, slots=True)
class Ranks:
    """Each rank's device and threads, and how the ranks talk: timeout, gradient buckets, comm hook."""

    device: str = "auto"  # auto | cpu | cuda
    dist_timeout_s: float = 120.0  # process-group timeout: a broken rank never hangs the rest
    num_threads: int = 0  # torch intra-op threads per rank; 0: torch's default
    bucket_cap_mb: float = 25.0  # DDP gradient bucket size
    comm_hook: str = "none"  # none | fp16 | bf16 | powersgd | package.module:function

    def __post_init__(self) -> None:
        _not_negative(self, ("num_threads",))
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--device must be auto, cpu or cuda, got {self.device!r}")
        if not self.bucket_cap_mb > 0:
            raise ValueError(f"--bucket-cap-mb must be > 0, got {self.bucket_cap_mb}")
        if self.comm_hook not in COMM_HOOKS and ":" not in self.comm_hook:
            raise ValueError(f"--comm-hook must be one of {COMM_HOOKS} or package.module:function, "
                             f"got {self.comm_hook!r}")
        if not self.dist_timeout_s > 0:
            raise ValueError("--dist-timeout-s must be > 0")


GROUPS: dict[str, type] = {"datasets": Datasets, "loader": LoaderOptions, "network": Network, "optim": Optim,
                           "checkpoints": Checkpoints, "reporting": Reporting, "ranks": Ranks}
# Every flat name (a flag, a TOML key) and the group holding it.
FLAT: dict[str, str] = {f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """Everything one training run needs, one group per concern; `cfg.lr` reads `cfg.optim.lr`."""

    datasets: Datasets
    loader: Any = dataclasses.field(default_factory=LoaderOptions)  # a LoaderOptions: make_loader's options
    network: Network = dataclasses.field(default_factory=Network)
    optim: Optim = dataclasses.field(default_factory=Optim)
    checkpoints: Checkpoints = dataclasses.field(default_factory=Checkpoints)
    reporting: Reporting = dataclasses.field(default_factory=Reporting)
    ranks: Ranks = dataclasses.field(default_factory=Ranks)

    def __post_init__(self) -> None:
        if self.loader.epoch_samples is not None and (len(self.sources) < 2 or self.loader.epoch_samples < 1):
            raise ValueError("--epoch-samples sets a mixture's epoch (>= 1 samples; leave it out for the sources' "
                             "sizes summed): give two or more --data sources")

    @classmethod
    def from_options(cls, **flat: Any) -> TrainConfig:
        """A config from flat names (as flags and TOML spell them); TypeError naming the closest for an unknown one."""
        grouped: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
        for name, value in flat.items():
            if name not in FLAT:
                close = difflib.get_close_matches(name, FLAT, n=1)
                raise TypeError(f"unknown trainer option {name!r}" + (f"; did you mean {close[0]!r}?" if close else ""))
            grouped[FLAT[name]][name] = value
        return cls(**{group: GROUPS[group](**values) for group, values in grouped.items()})

    def __getattr__(self, name: str) -> Any:
        """The flat view: cfg.lr is cfg.optim.lr (flat names are unique across groups)."""
        group = FLAT.get(name)
        if group is None:
            raise AttributeError(f"TrainConfig has no option {name!r}")
        return getattr(getattr(self, group), name)

    def flat(self) -> dict[str, Any]:
        """Every option by its flat name."""
        return {name: getattr(getattr(self, group), name) for name, group in FLAT.items()}

    @property
    def sources(self) -> tuple[DataSource, ...]:
        """The training datasets, one or several, with their weights."""
        data = self.datasets.data
        return data if isinstance(data, tuple) else (DataSource(data),)

    @property
    def data_label(self) -> str:
        """--data for messages: the URL, or the mixture as URL=WEIGHT + ..., credentials redacted."""
        return scrub(" + ".join(str(s) for s in self.sources), config_secrets(self))

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(f.strip() for f in self.datasets.features.split(",") if f.strip())

    @property
    def checkpoint_url(self) -> str:
        return self.checkpoints.checkpoint_dir or f"{self.reporting.out.rstrip('/')}/checkpoints"


def _positive(group: Any, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(group, name) < 1:
            raise ValueError(f"--{flag_of(name)} must be >= 1, got {getattr(group, name)}")


def _not_negative(group: Any, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(group, name) < 0:
            raise ValueError(f"--{flag_of(name)} must be >= 0, got {getattr(group, name)}")


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


def flag_of(name: str) -> str:
    """The flag of a flat name: batch_size -> batch-size."""
    return name.replace("_", "-")


def config_secrets(cfg: TrainConfig) -> tuple[str, ...]:
    """The credentials the config's own URLs carry (--data s3://KEY:SECRET@..., --checkpoint-dir, ...)."""
    texts = [v for v in cfg.flat().values() if isinstance(v, str)]
    return secrets_of([*texts, *(s.url for s in cfg.sources)])


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config as plain data by flat name, for metrics.jsonl and checkpoints: URLs redacted
    (s3://***@bucket/...), so no credential is ever saved; a resumed run takes them from its own
    flags or environment."""
    out = cfg.flat()
    if isinstance(cfg.datasets.data, tuple):
        out["data"] = [{"url": s.url, "weight": s.weight} for s in cfg.datasets.data]
    return scrub(out, config_secrets(cfg))
