"""The bill: a measured (or predicted) rate and a price per rank-hour as $ per epoch and per 1,000 samples,
or, for a token run (tokens_per_sample: the sequence length), per million tokens and per token.

Pure arithmetic, no I/O. Every rank is billed for the whole wall time, so the share of it spent
waiting for data or for exposed all-reduce is money spent on nothing ("wasted").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def cost_of(*, price_per_hour: float, world_size: int, samples_per_s: float, epoch_samples: int,
            wasted_share: float = 0.0, tokens_per_sample: int | None = None) -> dict[str, Any]:
    """$ figures of one job: price_per_hour is per rank; samples_per_s is the global rate (sequences/s
    for a token run, whose tokens_per_sample adds tokens/s and $ per million tokens)."""
    if price_per_hour < 0 or world_size < 1 or epoch_samples < 0:
        raise ValueError("price_per_hour >= 0, world_size >= 1 and epoch_samples >= 0, please")
    if not samples_per_s > 0:
        raise ValueError(f"samples_per_s must be > 0 to price a job, got {samples_per_s}")
    wasted_share = min(1.0, max(0.0, wasted_share))
    dollars_per_s = price_per_hour * world_size / 3600.0
    epoch_s = epoch_samples / samples_per_s
    per_epoch = dollars_per_s * epoch_s
    out: dict[str, Any] = {
        "price_per_hour": price_per_hour, "world_size": world_size, "dollars_per_hour": dollars_per_s * 3600,
        "epoch_hours": epoch_s / 3600.0, "dollars_per_epoch": per_epoch,
        "dollars_per_1k_samples": 1000.0 * dollars_per_s / samples_per_s,
        "wasted_share": wasted_share, "wasted_dollars_per_epoch": per_epoch * wasted_share}
    if tokens_per_sample:  # a sequence of a token run carries seq_len tokens of input (its labels overlap)
        tokens_per_s = samples_per_s * tokens_per_sample
        out.update(unit="tokens", tokens_per_sample=tokens_per_sample, tokens_per_s=tokens_per_s,
                   epoch_tokens=epoch_samples * tokens_per_sample, dollars_per_token=dollars_per_s / tokens_per_s,
                   dollars_per_1m_tokens=1e6 * dollars_per_s / tokens_per_s)
    return out


def choose(options: Sequence[dict[str, Any]], *, epochs: int, deadline_hours: float | None) -> dict[str, Any]:
    """Among priced options (cost_of results, each with "world_size" and "epoch_hours"), the world size
    with the lowest $ per epoch and the smallest one that finishes `epochs` within the deadline."""
    if not options:
        return {"cheapest": None, "smallest_meeting_deadline": None}
    cheapest = min(options, key=lambda o: (o["dollars_per_epoch"], o["world_size"]))
    meeting = None
    if deadline_hours is not None:
        fits = [o for o in options if o["epoch_hours"] * epochs <= deadline_hours]
        meeting = min(fits, key=lambda o: o["world_size"]) if fits else None
    return {"cheapest": cheapest["world_size"], "cheapest_dollars_per_epoch": cheapest["dollars_per_epoch"],
            "smallest_meeting_deadline": None if meeting is None else meeting["world_size"],
            "deadline_hours": deadline_hours, "epochs": epochs,
            "hours_at_smallest": None if meeting is None else meeting["epoch_hours"] * epochs,
            "dollars_at_smallest": None if meeting is None else meeting["dollars_per_epoch"] * epochs}


def wasted_share(stage_share: dict[str, float]) -> float:
    """The share of paid rank-time spent blocked: data wait plus exposed all-reduce."""
    return float(stage_share.get("wait", 0.0) + stage_share.get("comm_exposed", 0.0))


def describe(cost: dict[str, Any]) -> str:
    """One line for people: $ per epoch, per 1,000 samples (a token run: per million tokens and per
    token), and the wasted share in $."""
    unit = (f"${cost['dollars_per_1m_tokens']:.3g} per million tokens (${cost['dollars_per_token']:.3g} per token, "
            f"{cost['tokens_per_s']:,.0f} tokens/s)" if cost.get("unit") == "tokens"
            else f"${cost['dollars_per_1k_samples']:.3g} per 1000 samples")
    return (f"cost at ${cost['price_per_hour']:.2f}/rank-hour x {cost['world_size']}: "
            f"${cost['dollars_per_epoch']:.3g} per epoch ({_duration(cost['epoch_hours'] * 3600)}), "
            f"{unit}, wasted {cost['wasted_share']:.0%} "
            f"(${cost['wasted_dollars_per_epoch']:.3g} per epoch in data wait + exposed comm)")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.3g} min" if seconds < 7200 else f"{seconds / 3600:.3g} h"
