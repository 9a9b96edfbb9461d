"""Scheduled mixtures: piecewise-constant weights over the run's samples, each piece a mixture plan.

A schedule is pieces of weights, each lasting some samples of the run (the last one forever).
The run's positions are the requested epochs laid end to end (epoch e holds run positions
[e N, (e+1) N), N = epoch_samples), so a piece boundary may fall inside an epoch. An epoch is cut
into segments where pieces start; every segment is a mixture epoch of its own (plan/mix.py) with
the piece's weights: exact counts by largest remainder, interleaving within 1 of the shares, the
tail rounded down to the global batch of the topology the segment starts on. Every rank delivers
all of a segment before the next one starts (equal steps in each), so the samples delivered
follow the schedule in time, whatever the world size. Source s's draws continue across segments
and epochs: a segment's cursor base is the source's requested draws in every earlier segment, so
no sample repeats within a source pass. A segment plans under its own plan epoch (epoch << 12 |
segment): its windows and levels are keyed apart from its neighbours'. Resume splits the saved
progress over the segments (their steps at each level's topology), so it lands mid-piece too.
Pure, like mix.py: no I/O, no torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dataio.errors import StateError
from dataio.plan.mix import MixSource, MixState, Mixture, WorkerPlan
from dataio.plan.types import PlanConfig, PlanState, Skip, WorkerSlot, merge_ranges

SCHEDULE_VERSION = 1
MAX_SEGMENTS_PER_EPOCH = 1 << 12  # a segment's plan epoch is epoch << 12 | segment


@dataclass(frozen=True, slots=True)
class Piece:
    """Weights (one per source) for `samples` positions of the run; None: to the end (last piece)."""

    weights: tuple[float, ...]
    samples: int | None = None

    def __post_init__(self) -> None:
        weights = tuple(float(w) for w in self.weights)
        if not weights or any(not math.isfinite(w) or w < 0 for w in weights) or not any(weights):
            raise ValueError(f"a schedule piece needs finite weights >= 0, not all 0, got {self.weights!r}")
        object.__setattr__(self, "weights", weights)
        if self.samples is not None and (isinstance(self.samples, bool) or not isinstance(self.samples, int)
                                         or self.samples < 1):
            raise ValueError(f"a schedule piece lasts an int >= 1 of samples (None: to the end), got {self.samples!r}")


@dataclass(frozen=True, slots=True)
class Schedule:
    """Mixture weights over the run, for make_loader(weights=...): pieces, the last one open-ended."""

    pieces: tuple[Piece, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "pieces", open_ended(pieces_checked(self.pieces)))

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """From text (parse_schedule's syntax), as --mix-schedule takes it."""
        return cls(parse_schedule(text))


def linear_ramp(start: Sequence[float], end: Sequence[float], *, samples: int, num_pieces: int) -> tuple[Piece, ...]:
    """A linear ramp from `start` to `end` weights over `samples`, as num_pieces constant pieces
    (each the ramp's value at its middle); follow it with a piece of `end` to hold there."""
    if len(start) != len(end) or num_pieces < 1 or samples < num_pieces:
        raise ValueError(f"a ramp needs as many start as end weights and samples >= num_pieces >= 1, got "
                         f"{list(start)} -> {list(end)} over {samples} in {num_pieces}")
    cuts = [samples * i // num_pieces for i in range(num_pieces + 1)]
    return tuple(Piece(weights=tuple(a + (b - a) * (i + 0.5) / num_pieces for a, b in zip(start, end)),
                       samples=cuts[i + 1] - cuts[i]) for i in range(num_pieces))


def parse_schedule(text: str) -> tuple[Piece, ...]:
    """`0.7,0.2,0.1@1000000; 0.5,0.3,0.2` (weights@samples, the last without), a piece may be a
    ramp `0.7,0.2,0.1~0.5,0.3,0.2@1000000/10` (from~to@samples/pieces)."""
    pieces: list[Piece] = []
    for part in (p.strip() for p in text.split(";") if p.strip()):
        weights, _, length = part.partition("@")
        try:
            if "~" in weights:
                a, b = weights.split("~")
                samples, _, num = length.partition("/")
                pieces += linear_ramp(_floats(a), _floats(b), samples=int(samples), num_pieces=int(num or 10))
            else:
                pieces.append(Piece(weights=_floats(weights), samples=int(length) if length else None))
        except ValueError as exc:
            raise ValueError(f"mix schedule piece {part!r}: {exc} (expected W1,W2,...@SAMPLES, or "
                             "FROM~TO@SAMPLES/PIECES for a ramp; the last piece without @SAMPLES)") from None
    return open_ended(pieces_checked(pieces))


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def pieces_checked(pieces: Sequence[Piece]) -> tuple[Piece, ...]:
    """The pieces as a tuple; ValueError unless all give as many weights and only the last is open-ended."""
    pieces = tuple(pieces)
    if not pieces or any(not isinstance(p, Piece) for p in pieces):
        raise ValueError(f"a schedule is a non-empty sequence of Piece, got {pieces!r}")
    if len({len(p.weights) for p in pieces}) != 1:
        raise ValueError(f"every schedule piece needs one weight per source, got {[len(p.weights) for p in pieces]}")
    if any(p.samples is None for p in pieces[:-1]):
        raise ValueError("only the last schedule piece may last to the end (give the others a sample count)")
    return pieces


def open_ended(pieces: tuple[Piece, ...]) -> tuple[Piece, ...]:
    """`pieces`; ValueError, naming it, when the last piece has a length. A run past it would end
    there, early and silently, so a schedule given by a user must end open-ended. (A state saved
    before this check may hold such a piece: replaying it, scheduled() still takes it.)"""
    last = pieces[-1]
    if last.samples is not None:
        raise ValueError(f"the last schedule piece ({','.join(f'{w:g}' for w in last.weights)}@{last.samples}) "
                         "has a length, but the last piece lasts to the end of the run: drop its @SAMPLES, or "
                         "add a last piece without one (after a ramp: its end weights, to hold them)")
    return pieces


@dataclass(frozen=True, kw_only=True, eq=False)
class ScheduledMixture(Mixture):
    """A Mixture whose weights follow `pieces` over the run's positions; the sources' own weights
    are the first piece's. Built by `scheduled(...)`; plans through Mixture.plan_worker."""

    pieces: tuple[Piece, ...] = ()
    _segment_cache: dict = field(default_factory=dict, repr=False)

    def shares_at(self, position: int) -> list[float]:
        """The requested shares (weights / their sum) of the piece holding run position `position`."""
        start = 0
        for piece in self.pieces:
            if piece.samples is None or position < start + piece.samples:
                break
            start += piece.samples
        return [w / sum(piece.weights) for w in piece.weights]

    def segments(self, epoch: int) -> list[tuple[int, int]]:
        """(piece, requested length) of each segment of `epoch`, in order."""
        n, out = self.total, []
        lo, hi = epoch * n, (epoch + 1) * n
        start = 0
        for p, piece in enumerate(self.pieces):
            stop = math.inf if piece.samples is None else start + piece.samples
            a, b = max(lo, start), min(hi, stop)
            if a < b:
                out.append((p, int(b - a)))
            start = stop
            if start >= hi:
                break
        if len(out) > MAX_SEGMENTS_PER_EPOCH:
            raise ValueError(f"epoch {epoch} would hold {len(out)} schedule pieces, more than {MAX_SEGMENTS_PER_EPOCH}")
        return out

    def segment(self, epoch: int, index: int) -> Mixture:
        """Segment `index` of `epoch` as a Mixture of its own, its cursors continuing the earlier ones."""
        if (epoch, index) not in self._segment_cache:
            piece, length = self.segments(epoch)[index]
            base = self._counts_before(epoch * self.total + sum(n for _, n in self.segments(epoch)[:index]))
            self._segment_cache[epoch, index] = Mixture(sources=self._weighted(piece), epoch_samples=length,
                                                        cursor_base=tuple(int(c) for c in base))
        return self._segment_cache[epoch, index]

    def _weighted(self, piece: int) -> tuple[MixSource, ...]:
        return tuple(dataclasses.replace(s, weight=w) for s, w in zip(self.sources, self.pieces[piece].weights))

    def _piece_counts(self, piece: int, length: int) -> np.ndarray:
        key = ("counts", piece, length)
        if key not in self._segment_cache:
            self._segment_cache[key] = Mixture(sources=self._weighted(piece), epoch_samples=length).counts
        return self._segment_cache[key]

    def _counts_before(self, x: int) -> np.ndarray:
        """(n,) int64: each source's requested draws in the run's positions [0, x), segment by segment
        (full epochs inside one piece counted once and multiplied)."""
        n, total, start = self.total, np.zeros(len(self.sources), dtype=np.int64), 0
        for p, piece in enumerate(self.pieces):
            stop = x if piece.samples is None else min(x, start + piece.samples)
            lo = start
            while lo < stop:
                epoch_end = (lo // n + 1) * n
                if lo % n == 0 and epoch_end <= stop:  # whole epochs inside this piece
                    k = (stop - lo) // n
                    total += k * self._piece_counts(p, n)
                    lo += k * n
                    continue
                hi = min(stop, epoch_end)
                total += self._piece_counts(p, hi - lo)
                lo = hi
            if piece.samples is None or start + piece.samples >= x:
                break
            start += piece.samples
        return total

    def _steps(self, epoch: int, index: int, config: PlanConfig, world_size: int, state: PlanState) -> int:
        return Mixture.steps_from(self.segment(epoch, index), config=config, world_size=world_size, state=state)

    def split(self, state: PlanState, config: PlanConfig) -> tuple[int, PlanState]:
        """(segment, its PlanState) of an epoch's saved progress: each level's batches go to the
        segments in order, as many as each has left at that level's topology."""
        index, seg, _ = self.split_skipping(state, config)
        return index, seg

    def split_skipping(self, state: PlanState, config: PlanConfig) -> tuple[int, PlanState, tuple]:
        """split, with the state's skip filters: each lands in the segment in progress where it was
        applied (at that segment's level), and every later segment filters all of them at its start.
        The third item: the id ranges skipped by the end of the progress (for the later segments)."""
        epoch, count = state.epoch, len(self.segments(state.epoch))
        skips = {s.level: s.ranges for s in state.skip}
        index, seg, skipped = 0, PlanState(epoch=_plan_epoch(epoch, 0)), ()
        for i in range(len(state.progress) + 1):
            if i in skips:
                seg, skipped = seg.skipping(skips[i]), merge_ranges([*skipped, *skips[i]])
            if i == len(state.progress):
                break
            level, left_over = state.progress[i], state.progress[i].batches
            while left_over > 0:
                left = self._steps(epoch, index, config, level.world_size, seg)
                if left == 0:
                    index += 1
                    if index == count:
                        raise StateError(f"the saved progress passes the end of epoch {epoch} of this schedule; "
                                         "it belongs to another mixture or schedule: start the epoch over")
                    seg = _fresh(epoch, index, skipped)
                    continue
                take = min(left, left_over)
                seg = seg.advanced(world_size=level.world_size, num_workers=level.num_workers, batches=take)
                left_over -= take
        return index, seg, skipped

    def steps_from(self, *, config: PlanConfig, world_size: int, state: PlanState) -> int:
        index, seg, skipped = self.split_skipping(state, config)
        return sum(self._steps(state.epoch, j, config, world_size,
                               seg if j == index else _fresh(state.epoch, j, skipped))
                   for j in range(index, len(self.segments(state.epoch))))

    def plan_worker(self, *, config: PlanConfig, slot: WorkerSlot, state: MixState) -> WorkerPlan:
        """The worker's segments from the state's one to the epoch's end, concatenated: in a later
        segment it takes the role of the worker that makes its batches (round robin goes on)."""
        epoch = state.plan.epoch
        index, seg, skipped = self.split_skipping(state.plan, config)
        windows, numbers, offset, orders = [], [], 0, {}  # orders: the sources' pass orders, shared by segments
        for j in range(index, len(self.segments(epoch))):
            sub = seg if j == index else _fresh(epoch, j, skipped)
            mix = self.segment(epoch, j)
            worker = slot if j == index else dataclasses.replace(
                slot, worker_id=(slot.worker_id - offset) % slot.num_workers)
            plan = Mixture.plan_worker(mix, config=config, slot=worker, state=MixState(plan=sub, mixture={}),
                                       orders=orders)
            windows += plan.windows
            numbers.append(plan.batch_numbers + offset)
            offset += plan.num_steps
        return WorkerPlan(num_steps=offset, batch_numbers=np.concatenate(numbers) if numbers else
                          np.zeros(0, dtype=np.int64), windows=tuple(windows))

    def describe(self) -> dict:
        return {**super().describe(), "schedule": {"schedule_version": SCHEDULE_VERSION, "pieces": [
            {"weights": list(p.weights), "samples": p.samples} for p in self.pieces]}}

    can_add_sources = True

    def check_schedule(self, saved: dict, position: PlanState, config: PlanConfig) -> list[str]:
        """StateError when the weights of the run's positions up to the end of the segment in progress
        (those planned: the past and that segment) differ from the saved schedule's; else the later
        changes in words (allowed). Sources added at the end weigh 0 in the saved pieces: they join
        where a later piece gives them a weight (a segment boundary, or the next epoch)."""
        theirs = (saved.get("schedule") or {}).get("pieces")
        if not isinstance(theirs, list):
            raise StateError("cannot resume: the state was saved by an unscheduled mixture, this one has a weight "
                             "schedule; resume with the same weights (a schedule may start with a fresh run)")
        n = len(self.sources)
        theirs = [{**p, "weights": list(p.get("weights", ())) + [0.0] * (n - len(p.get("weights", ())))}
                  for p in theirs]
        mine, horizon = self.describe()["schedule"]["pieces"], self._planned_until(theirs, position, config)
        past = [_spans(x, horizon) for x in (theirs, mine)]
        for i, (a, b) in enumerate(zip(*past)):
            if a != b:
                raise StateError(f"cannot resume: schedule piece {i} gave run positions {a[0]}..{a[1]} the weights "
                                 f"{list(a[2])} when saved, this schedule gives {b[0]}..{b[1]} {list(b[2])}; the run "
                                 f"has planned every position below {horizon} (the past and the segment in "
                                 "progress): change only later pieces")
        ends = [{s[1] for s in _spans(x, math.inf)} for x in (theirs, mine)]
        if horizon in ends[0] and horizon not in ends[1] and horizon % self.total:
            raise StateError(f"cannot resume: the segment in progress ends at run position {horizon}, where a saved "
                             "schedule piece ends; this schedule moves that end: keep it, change only later pieces")
        full = [_spans(x, math.inf) for x in (theirs, mine)]
        notes = [f"schedule piece {i} from run position {b[0]}: {list(a[2])} until {a[1]} -> {list(b[2])} until {b[1]}"
                 for i, (a, b) in enumerate(zip(*full)) if a != b] + (
            [f"the schedule now has {len(mine)} pieces (was {len(theirs)})"] if len(mine) != len(theirs) else [])
        return notes + self._joins(len(saved.get("sources", ())), mine)

    def _planned_until(self, theirs: list, position: PlanState, config: PlanConfig) -> int:
        """The run position where the saved schedule's segment in progress ends (its epoch's end at the latest)."""
        old = scheduled(self.sources, [Piece(tuple(p["weights"]), p.get("samples")) for p in theirs], self.total)
        index, _ = old.split(position, config)
        return position.epoch * self.total + sum(length for _, length in old.segments(position.epoch)[:index + 1])

    def _joins(self, num_saved: int, mine: list) -> list[str]:
        """Notes on sources added since the state was saved: where each first gets a weight."""
        notes = []
        for s in range(num_saved, len(self.sources)):
            start = 0
            for p in mine:
                if p["weights"][s] > 0:
                    notes.append(f"source {s} ({self.sources[s].name}) added: it joins at run position {start} "
                                 f"with weight {p['weights'][s]} (epoch {start // self.total})")
                    break
                start = math.inf if p.get("samples") is None else start + p["samples"]
            else:
                notes.append(f"source {s} ({self.sources[s].name}) added with weight 0 in every piece: never read")
        return notes


def _spans(pieces: list, horizon: float) -> list[tuple]:
    """(start, stop, weights) of each described piece, clipped to run positions below `horizon`."""
    out, start = [], 0
    for p in pieces:
        stop = math.inf if p.get("samples") is None else start + p["samples"]
        if start >= horizon:
            break
        out.append((start, min(stop, horizon), tuple(p.get("weights", ()))))
        start = stop
    return out


def scheduled(sources: Sequence[MixSource], pieces: Sequence[Piece], epoch_samples: int | None = None
              ) -> ScheduledMixture:
    """A ScheduledMixture of `sources` (weights only: repeat sources cannot follow a schedule)."""
    pieces = pieces_checked(pieces)
    if len(pieces[0].weights) != len(sources):
        raise ValueError(f"the schedule gives {len(pieces[0].weights)} weights per piece for {len(sources)} sources")
    if any(s.repeat is not None for s in sources):
        raise ValueError("a scheduled mixture takes weights only; give repeat sources a weight instead")
    first = tuple(dataclasses.replace(s, weight=w) for s, w in zip(sources, pieces[0].weights))
    return ScheduledMixture(sources=first, epoch_samples=epoch_samples, pieces=pieces)


def _fresh(epoch: int, segment: int, skipped: tuple) -> PlanState:
    """The start of a segment of `epoch`, filtering the `skipped` id ranges."""
    return PlanState(epoch=_plan_epoch(epoch, segment), skip=(Skip(level=0, ranges=skipped),) if skipped else ())


def _plan_epoch(epoch: int, segment: int) -> int:
    return (epoch << 12) | segment
