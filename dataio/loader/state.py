"""The loader's saved state: small, flat, JSON-able, versioned, checked on load.

The plan's position (epoch + batches delivered per topology) plus what must match for the plan
to replay (dataset fingerprint, seed, batch size, tail, shuffle). This is the edge: inside the
loader the position is a frozen PlanState; only here does it become a dict and JSON text.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping
from typing import Any

from dataio.errors import StateError
from dataio.plan.mix import Mixture, check_mixture
from dataio.plan.types import PLAN_VERSION, PlanConfig, PlanState

STATE_FORMAT_VERSION = 1
# Saved keys that must equal this loader's own for the plan to replay; (key, what to tell the user).
_MUST_MATCH = (
    ("fingerprint", "dataset fingerprint (the state comes from another dataset or a rewritten one)"),
    ("seed", "seed"),
    ("batch_size", "batch size (per rank)"),
    ("tail", "tail policy"),
    ("shuffle", "shuffle setting"),
    ("shuffle_window", "shuffle window"),
)


def make_state(plan: PlanState, *, fingerprint: str, plan_config: PlanConfig,
               mixture: Mixture, epoch_complete: bool = False) -> dict[str, Any]:
    """The state dict a loader saves: flat, JSON-able scalars only.

    The plan (PlanState.to_dict()) is stored as JSON text: torch.distributed.checkpoint loads
    into the structure of a fresh loader's state_dict, whose progress list would be empty. A
    mixture's loader also saves the mixture's description, so another mixture is refused by name;
    a single dataset (a mixture of one: Mixture.single) saves none.
    """
    state = {
        "format_version": STATE_FORMAT_VERSION,
        "epoch": int(plan.epoch),
        "plan": json.dumps(plan.to_dict(), sort_keys=True),
        **_identity(fingerprint, plan_config),
    }
    if not mixture.single:
        state["mixture"] = json.dumps(mixture.describe(), sort_keys=True)
    if epoch_complete:  # saved after the epoch's last batch: carries over to a new version of the dataset
        state["epoch_complete"] = True
    return state


def _check_mixture(state: dict[str, Any], mixture: Mixture) -> None:
    """StateError when the state's mixture (or its absence) differs from this loader's, naming how."""
    saved = state.get("mixture")
    if saved is None and mixture.single:
        return
    if mixture.single:
        try:
            names = [s.get("name") for s in json.loads(saved)["sources"]]
        except (ValueError, KeyError, TypeError, AttributeError):
            names = "?"
        raise StateError(f"cannot resume: the state was saved by a mixture of {len(names)} sources {names}, "
                         "this loader reads one dataset; pass the same sources and weights")
    if saved is None:
        raise StateError(f"cannot resume: the state was saved by a single-dataset loader, this loader mixes "
                         f"{len(mixture.sources)} sources; load it into a loader of that one dataset")
    try:
        description = json.loads(saved)
    except (ValueError, TypeError):
        raise StateError("loader state's 'mixture' is not valid JSON; start the epoch afresh") from None
    if not isinstance(description, dict):
        raise StateError("loader state's 'mixture' must describe a mixture; start the epoch afresh")
    check_mixture(mixture, description)


def _identity(fingerprint: str, plan_config: PlanConfig) -> dict[str, Any]:
    """The saved values a resuming loader must share (the _MUST_MATCH keys), in saved order."""
    return {
        "fingerprint": fingerprint,
        "seed": int(plan_config.seed),
        "batch_size": int(plan_config.batch_size),
        "tail": plan_config.tail,
        "shuffle": bool(plan_config.shuffle),
        "shuffle_window": int(plan_config.shuffle_window),
    }


def _carry_over(state: dict[str, Any], mine: dict[str, Any]) -> PlanState | None:
    """A state saved at an epoch boundary of another version of the dataset (an append, a rewrite):
    the next epoch starts afresh on this one. None when the dataset is the same (or no boundary)."""
    if state["fingerprint"] == mine["fingerprint"]:
        return None
    if any(state[k] != mine[k] for k, _ in _MUST_MATCH if k not in ("fingerprint", "shuffle_window")):
        return None  # the checks below name what differs
    plan = state["plan"]
    try:
        progress = (json.loads(plan) if isinstance(plan, (str, bytes)) else plan).get("progress")
    except (ValueError, AttributeError):
        return None
    if state.get("epoch_complete"):
        return PlanState(epoch=int(state["epoch"]) + 1)
    if not progress:
        return PlanState(epoch=int(state["epoch"]))
    raise StateError(
        f"cannot resume: the state was saved in the middle of epoch {state['epoch']} of another version of this "
        f"dataset (fingerprint {state['fingerprint']}, now {mine['fingerprint']}: samples were appended or the "
        "dataset was rewritten); a mid-epoch position cannot carry over. Resume from a checkpoint saved at an "
        "epoch boundary (it carries over), or start the epoch afresh without load_state_dict"
    )


def _at_boundary_of_old_plan(state: dict[str, Any], plan: dict[str, Any]) -> PlanState | None:
    """A state of another plan version saved where nothing of an epoch was delivered (its start, or
    after its last batch): no order to replay, so the next epoch starts as this version orders it.
    None otherwise (a mid-epoch state of another version is refused by PlanState.from_dict)."""
    if plan.get("plan_version") == PLAN_VERSION or type(plan.get("plan_version")) is not int:
        return None
    epoch = state["epoch"]
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0 or plan.get("epoch") != epoch:
        return None
    if state.get("epoch_complete") is True:
        return PlanState(epoch=epoch + 1)
    if plan.get("progress") == []:
        return PlanState(epoch=epoch)
    return None


def check_state(state: Any, *, fingerprint: str, plan_config: PlanConfig, mixture: Mixture) -> PlanState:
    """The saved PlanState if `state` fits this loader; StateError saying what differs otherwise."""
    if not isinstance(state, dict):
        raise StateError(f"a loader state must be a dict from ShardLoader.state_dict(), got {type(state).__name__}")
    version = state.get("format_version")
    if version != STATE_FORMAT_VERSION:
        raise StateError(
            f"loader state format version {version!r} is not {STATE_FORMAT_VERSION}; it was saved by "
            "another shardify version: resume with that version, or start the epoch afresh"
        )
    missing = [k for k, _ in _MUST_MATCH if k not in state] + [k for k in ("plan", "epoch") if k not in state]
    if missing:
        raise StateError(f"loader state lacks {missing}; pass the dict ShardLoader.state_dict() returned")
    _check_mixture(state, mixture)  # before the fingerprint: it names which source or weight differs
    fingerprint = _saved_subset_fingerprint(state, mixture) or fingerprint
    mine = _identity(fingerprint, plan_config)
    carried = _carry_over(state, mine)
    if carried is not None:
        return carried
    for key, what in _MUST_MATCH:
        if state[key] != mine[key]:
            raise StateError(
                f"cannot resume: the saved {what} is {state[key]!r} but this loader has {mine[key]!r}; "
                f"build the loader with the same {key} (or start afresh without load_state_dict)"
            )
    plan = state["plan"]
    if isinstance(plan, (str, bytes)):
        try:
            plan = json.loads(plan)
        except ValueError as exc:
            raise StateError(f"loader state's 'plan' is not valid JSON ({exc}); start the epoch afresh") from None
    if not isinstance(plan, dict):
        raise StateError("loader state's 'plan' must be PlanState.to_dict() or its JSON text")
    old_version = _at_boundary_of_old_plan(state, plan)
    if old_version is not None:
        return old_version
    position = PlanState.from_dict(plan)
    if position.epoch != state["epoch"]:
        raise StateError(f"loader state is inconsistent: epoch {state['epoch']} vs plan epoch {position.epoch}")
    if hasattr(mixture, "check_schedule"):  # pieces that ran must match; later ones may change (plan/schedule.py)
        for note in mixture.check_schedule(json.loads(state["mixture"]), position, plan_config):
            warnings.warn(f"resuming with a changed mixture schedule: {note}", UserWarning, stacklevel=3)
    return position


def saved_skips(state: Any) -> tuple[tuple[int, int], ...]:
    """Every id range a saved state skips (none when it skips none or is not a loader state)."""
    try:
        plan = state["plan"]
        plan = json.loads(plan) if isinstance(plan, (str, bytes)) else plan
        skip = plan.get("skip") or ()
        return PlanState(epoch=0).skipping([tuple(r) for s in skip for r in s["ids"]]).skipped_ids()
    except (KeyError, TypeError, ValueError, AttributeError):
        return ()


def added_sources(state: Any, mixture: Mixture) -> int:
    """How many sources `mixture` has beyond those `state` was saved with, when it may gain them: a
    scheduled mixture whose first sources are the saved ones (the saved fingerprint is theirs, as
    check_state requires). 0 for the same sources, and for anything check_state would refuse."""
    if not isinstance(state, dict):
        return 0
    subset = _saved_subset_fingerprint(state, mixture)
    if subset is None or state.get("fingerprint") != subset:
        return 0
    return len(mixture.sources) - len(json.loads(state["mixture"])["sources"])


def _saved_subset_fingerprint(state: dict[str, Any], mixture: Mixture) -> str | None:
    """A scheduled mixture that gained sources since the state was saved: the fingerprint of its first
    (saved) sources, which the state's must equal. None otherwise."""
    try:
        num_saved = len(json.loads(state["mixture"])["sources"])
    except (KeyError, TypeError, ValueError):
        return None
    if not getattr(mixture, "can_add_sources", False) or not 0 < num_saved < len(mixture.sources):
        return None
    described = mixture.describe()
    return mixture_fingerprint({**described, "sources": described["sources"][:num_saved]})


def mixture_fingerprint(described: Mapping) -> str:
    """A mixture's identity in a saved state: its description (sources, weights, epoch) hashed, without
    a schedule's pieces (pieces yet to come may change on resume)."""
    described = {k: v for k, v in described.items() if k != "schedule"}
    text = json.dumps(described, sort_keys=True)
    return "mix-" + hashlib.sha256(text.encode()).hexdigest()[:32]
