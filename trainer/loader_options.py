"""The loader's options as the trainer's: one `--flag` per loader option, made from its name, default and type.

The trainer never re-spells a loader option. `loader_fields()` lists the loader's flat options
(the one place that looks at dataio's config); `LoaderOptions` is the trainer config's loader
group, made from that list; `make_options` turns it (plus what the trainer derives per split)
into make_loader's keywords, and LoaderConfig validates them with its own messages.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import MISSING, dataclass
from typing import Any

from dataio.loader.config import LoaderConfig

# Set by the trainer for each split from its own flags (--augment, --features, --label-space,
# --mix-schedule, the storage flags, the device), or hooks no flag can carry: never a flag.
DERIVED = ("train", "tail", "shuffle", "fields", "transform", "collate", "storage", "label_space", "mix_schedule",
           "pin_memory")
# Where the trainer's default differs from the loader's, and why: the loader has no default batch
# size; small images keep the demo models cheap on CPU (the loader's 224 px is ImageNet's); a token
# dataset needs a sequence length (the loader's None means "not tokens", which the manifest decides here).
TRAINER_DEFAULTS: dict[str, Any] = {"batch_size": 32, "image_size": 32, "seq_len": 256}
SCALARS = (bool, int, float, str)  # what a flag or a TOML value can hold


# The two functions below are the trainer's only view of LoaderConfig's shape: its flat view.
def loader_fields() -> list[tuple[str, Any, Any]]:
    """(name, default, type) of every flat loader option, in the loader's order; default MISSING when it has none."""
    return [(o.name, o.default, o.type) for o in LoaderConfig.options()]


def loader_help() -> dict[str, str]:
    """Each flat loader option's one line of help, as the loader states it."""
    return {o.name: o.help for o in LoaderConfig.options()}


def loader_config(**flat: Any) -> LoaderConfig:
    """LoaderConfig from flat options, with the loader's own checks and messages."""
    return LoaderConfig.from_options(**flat)


@dataclass(frozen=True, slots=True)
class Option:
    """One loader option as a flag: its scalar kind (what argparse and TOML parse), and whether None is allowed."""

    name: str
    default: Any
    kind: type
    optional: bool


def scalar_of(hint: Any) -> tuple[type | None, bool]:
    """(the scalar type of a hint, whether None is allowed): int | None -> (int, True); (None, _) when
    no flag can carry it (a callable, a mapping, a tuple)."""
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    optional = type(None) in args
    rest = [a for a in args if a is not type(None)]
    return (rest[0] if len(rest) == 1 and rest[0] in SCALARS else None), optional


def options() -> tuple[Option, ...]:
    """The loader's options that are trainer flags, in the loader's order (DERIVED ones left out);
    TypeError for an option that is neither a scalar nor derived: the trainer must decide it."""
    out = []
    for name, default, hint in loader_fields():
        if name in DERIVED:
            continue
        kind, optional = scalar_of(hint)
        if kind is None:
            raise TypeError(f"loader option {name!r} ({hint}) is no scalar flag: add it to trainer/loader_options.py "
                            "DERIVED and set it in make_options")
        out.append(Option(name, TRAINER_DEFAULTS.get(name, default), kind, optional))
    return tuple(out)


OPTIONS = options()
# make_loader's own topology option, kept beside the loader's: worker processes (or threads) per rank.
NUM_WORKERS = Option("num_workers", 2, int, False)


def _fields() -> list[tuple[str, Any, Any]]:
    out = []
    for opt in (NUM_WORKERS, *OPTIONS):
        assert opt.default is not MISSING, f"{opt.name}: give it a TRAINER_DEFAULTS entry"
        out.append((opt.name, opt.kind | None if opt.optional else opt.kind, dataclasses.field(default=opt.default)))
    return out


def _check(self: Any) -> None:
    """LoaderConfig's own checks, with its own messages (a flag it refuses is refused here, before any run)."""
    flat = {o.name: getattr(self, o.name) for o in OPTIONS}
    if flat.get("context_length") is not None:  # --model clip's: its pair loader reads no token dataset, so the
        flat["seq_len"] = None                   # trainer's default --seq-len (gpt's) is not passed with it
    try:
        loader_config(**flat)
    except (TypeError, ValueError) as exc:  # TypeError: a value of the wrong kind, a bad configuration too
        name, _, rest = str(exc).partition(" ")
        flag = f"--{name.replace('_', '-')} " if name in flat else f"{name} "  # the loader's name, as the flag
        raise ValueError(flag + rest) from None
    if not isinstance(self.num_workers, int) or self.num_workers < 0:
        raise ValueError(f"--num-workers must be >= 0, got {self.num_workers!r}")


LoaderOptions = dataclasses.make_dataclass(
    "LoaderOptions", _fields(), frozen=True, kw_only=True, slots=True, namespace={"__post_init__": _check})
LoaderOptions.__module__ = __name__
LoaderOptions.__doc__ = ("The trainer's loader group: every flag option of make_loader (LoaderConfig's fields, "
                         "num_workers), with the loader's names, defaults and checks.")


def make_options(loader: Any, **derived: Any) -> dict[str, Any]:
    """make_loader's keywords: every option of the `loader` group, then what the trainer derived for
    this split (keys of DERIVED, or a group option it sets for the split, such as seq_len=None)."""
    return {**{o.name: getattr(loader, o.name) for o in (NUM_WORKERS, *OPTIONS)}, **derived}
