"""The run's history in the loader state: every pass over an epoch and the runs it was delivered in.

The plan's position (PlanState) says only how far the current epoch got. To answer "which samples
made step N" for any step of the run, the state also carries, versioned, every pass since the run
began (plan/which.py's HistoryPass): epoch, dataset fingerprint, plan config and the runs (topology,
batches, grad_accum). A pass is a few integers, so the history stays small for any run length.
A state saved before the history existed starts one from its current epoch's progress (its
grad_accum unknown: taken as the next run's, else 1); earlier epochs cannot be answered.
"""

from __future__ import annotations

import json
from typing import Any

from dataio.errors import StateError
from dataio.plan.types import PlanConfig, PlanState, Skip, Topology
from dataio.plan.which import HistoryPass, HistoryRun, replay_runs

HISTORY_VERSION = 1
HISTORY_KEY = "history"  # the loader state's key: JSON text (torch.distributed.checkpoint keeps it as is)


class HistoryKeeper:
    """The closed passes and the runs of the current one up to the loader's `_state`; the loader
    adds what it delivered whenever its position moves (a new iteration, a new epoch)."""

    def __init__(self) -> None:
        self.passes: list[HistoryPass] = []
        self.current: list[HistoryRun] = []
        self.grad_accum = 1  # set by the trainer: batches per optimizer step from now on

    def advance(self, *, position: PlanState, delivered: int, topology: Topology, fingerprint: str,
                plan: PlanConfig, new_pass: bool) -> None:
        """Add `delivered` batches at `topology` to the current pass (of position.epoch); with
        new_pass, close it: the loader's next iteration starts an epoch afresh."""
        self.current = _added(self.current, topology, delivered, self.grad_accum, _filtered_on_top(position))
        if new_pass:
            if self.current:
                self.passes.append(HistoryPass(epoch=position.epoch, fingerprint=fingerprint, plan=plan,
                                               runs=tuple(self.current), skip=position.skip))
            self.current = []

    def snapshot(self, *, position: PlanState, delivered: int, topology: Topology, fingerprint: str,
                 plan: PlanConfig) -> str:
        """The history as JSON text, the current pass (with `delivered` more batches) last."""
        runs = _added(self.current, topology, delivered, self.grad_accum, _filtered_on_top(position))
        passes = self.passes + ([HistoryPass(epoch=position.epoch, fingerprint=fingerprint, plan=plan,
                                             runs=tuple(runs), skip=position.skip)] if runs else [])
        return dumps_history(passes)

    def load(self, state: dict[str, Any], position: PlanState, *, fingerprint: str, plan: PlanConfig) -> None:
        """Take the saved history of `state` (loaded at `position`); a state without one starts it
        from the position's progress."""
        passes = loads_history(state.get(HISTORY_KEY))
        if passes and passes[-1].epoch == position.epoch and replay_runs(passes[-1]).progress == position.progress:
            self.passes, self.current = passes[:-1], list(passes[-1].runs)
            return
        self.passes = passes if passes is not None else []
        self.current = [HistoryRun(world_size=p.world_size, num_workers=p.num_workers, batches=p.batches,
                                   grad_accum=0) for p in position.progress]  # 0: unknown (legacy)


def _filtered_on_top(position: PlanState) -> bool:
    """A skip filter sits on the position's last level: what comes next starts a level of its own."""
    return bool(position.skip) and position.skip[-1].level == len(position.progress)


def _added(runs: list[HistoryRun], topology: Topology, batches: int, grad_accum: int,
           new_level: bool = False) -> list[HistoryRun]:
    """`runs` with `batches` more at topology and grad_accum (merged into the last run when alike,
    unless they start a new level: after a skip filter)."""
    if batches <= 0:
        return list(runs)
    last = runs[-1] if runs and not new_level else None
    if last is not None and (last.world_size, last.num_workers, last.grad_accum) == (
            topology.world_size, topology.num_workers, grad_accum):
        return runs[:-1] + [HistoryRun(world_size=last.world_size, num_workers=last.num_workers,
                                       batches=last.batches + batches, grad_accum=grad_accum)]
    return runs + [HistoryRun(world_size=topology.world_size, num_workers=topology.num_workers, batches=batches,
                              grad_accum=grad_accum)]


def dumps_history(passes: list[HistoryPass]) -> str:
    """JSON text of the passes (HISTORY_VERSION)."""
    return json.dumps({"history_version": HISTORY_VERSION, "passes": [
        {"epoch": p.epoch, "fingerprint": p.fingerprint,
         "plan": {"seed": p.plan.seed, "batch_size": p.plan.batch_size, "tail": p.plan.tail,
                  "shuffle": p.plan.shuffle, "shuffle_window": p.plan.shuffle_window},
         "runs": [[r.world_size, r.num_workers, r.batches, r.grad_accum] for r in p.runs],
         **({"skip": [{"level": s.level, "ids": [list(r) for r in s.ranges]} for s in p.skip]} if p.skip else {})}
        for p in passes]}, sort_keys=True)


def loads_history(text: Any) -> list[HistoryPass] | None:
    """The passes of dumps_history's text; None when absent (a state saved before the history)."""
    if text is None:
        return None
    try:
        doc = json.loads(text) if isinstance(text, (str, bytes)) else text
        if doc.get("history_version") != HISTORY_VERSION:
            raise StateError(f"loader state history version {doc.get('history_version')!r} is not "
                             f"{HISTORY_VERSION}: it was saved by another shardify; use that version to ask about it")
        return [HistoryPass(epoch=int(p["epoch"]), fingerprint=str(p["fingerprint"]), plan=PlanConfig(**p["plan"]),
                            runs=tuple(HistoryRun(world_size=w, num_workers=k, batches=b, grad_accum=g)
                                       for w, k, b, g in p["runs"]),
                            skip=tuple(Skip(level=s["level"], ranges=tuple(map(tuple, s["ids"])))
                                       for s in p.get("skip", ())))
                for p in doc["passes"]]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise StateError(f"loader state's history is malformed ({exc}); it cannot be replayed") from None


def resolved_grad_accum(passes: list[HistoryPass], current: int) -> tuple[HistoryPass, ...]:
    """The passes with every unknown grad_accum (0, a legacy state's) taken from the next known run
    (else `current`): what a history started from an older state can assume."""
    out, known = [], current
    for p in reversed(passes):
        runs = []
        for r in reversed(p.runs):
            known = r.grad_accum or known
            runs.append(HistoryRun(world_size=r.world_size, num_workers=r.num_workers, batches=r.batches,
                                   grad_accum=known))
        out.append(HistoryPass(epoch=p.epoch, fingerprint=p.fingerprint, plan=p.plan, runs=tuple(reversed(runs)),
                               skip=p.skip))
    return tuple(reversed(out))
