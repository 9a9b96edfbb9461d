"""Where a loader stands in the run (ShardLoader's bookkeeping, for samples and tokens alike): its
topology, the epoch and batches delivered, and the run's history of passes that `shardify which`
replays. The plan itself is the opened data's (loader/opened.py)."""

from __future__ import annotations

from typing import Any

from dataio.errors import StateError
from dataio.loader.config import check_int
from dataio.loader.history import HISTORY_KEY, HistoryKeeper
from dataio.loader.state import added_sources, check_state
from dataio.plan.types import PlanConfig, PlanState, Topology


class PlanPosition:
    """Mixin: the position (`_state`, `_delivered`, `_finished`) and history of a loader whose class
    sets `topology`, `fingerprint`, `plan_config`, `data` and `history` when it is built, and replays a
    saved position with its own `_steps_from(state)` (ValueError or IndexError past the epoch)."""

    topology: Topology
    fingerprint: str
    plan_config: PlanConfig
    history: HistoryKeeper
    data: Any  # loader/opened.py OpenedData: checks that a state was saved by a loader of its kind
    mixture: Any  # plan.mix.Mixture (Mixture.single for one dataset), or a ScheduledMixture
    _state: PlanState
    _delivered: int
    _finished: bool
    _active_steps: Any  # the epoch's step plan while an iteration runs, else None

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def world_size(self) -> int:
        return self.topology.world_size

    @property
    def epoch(self) -> int:
        return int(self._state.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration delivers; a resumed epoch keeps its position (and a
        new one keeps the skip list)."""
        check_int("epoch", epoch, minimum=0)
        if epoch != self._state.epoch or self._finished:
            self._record_history(new_pass=True)
            self._state, self._delivered, self._finished = self._state.next_epoch(epoch), 0, False

    def shares_at(self, samples_seen: int) -> list[float] | None:
        """A scheduled mixture's requested shares at the run's sample `samples_seen`; None for fixed weights."""
        shares_at = getattr(self.mixture, "shares_at", None)  # only a ScheduledMixture has a schedule
        return list(shares_at(samples_seen)) if shares_at is not None else None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from a state saved by any rank of any topology; StateError says what does not fit."""
        if self._active_steps is not None:
            raise RuntimeError("load_state_dict during an iteration; call it between epochs")
        self.data.check_kind(state_dict)
        state = check_state(state_dict, fingerprint=self.fingerprint, plan_config=self.plan_config,
                            mixture=self.mixture)
        try:
            self._steps_from(state)  # replays the saved progress: refuses positions past the epoch
        except (ValueError, IndexError) as exc:
            raise StateError(f"loader state does not fit this dataset: {exc}") from None
        self.history.load(state_dict, state, fingerprint=self.fingerprint, plan=self.plan_config)
        self._state, self._delivered, self._finished = state, 0, False

    def sources_added_since(self, state_dict: dict[str, Any]) -> int:
        """Sources this loader's scheduled mixture appends to those `state_dict` was saved with (it
        resumes that state: plan/schedule.py); 0 when they are the same, or the state does not fit."""
        return added_sources(state_dict, self.mixture)

    def _record_history(self, *, new_pass: bool) -> None:
        """Fold the batches delivered since `_state` into the run's history before the position moves."""
        self.history.advance(position=self._state, delivered=self._delivered, topology=self.topology,
                             fingerprint=self.fingerprint, plan=self.plan_config, new_pass=new_pass)

    def _with_history(self, state: dict[str, Any]) -> dict[str, Any]:
        """`state` (a saved position) with the run's history up to now."""
        state[HISTORY_KEY] = self.history.snapshot(position=self._state, delivered=self._delivered,
                                                   topology=self.topology, fingerprint=self.fingerprint,
                                                   plan=self.plan_config)
        return state
