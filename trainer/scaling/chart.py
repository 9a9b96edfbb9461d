"""scaling.png: samples/s (tokens/s for a token run) and efficiency against world size (measured, ideal, predicted), and the
stacked step-time shares of each measured run."""

from __future__ import annotations

from typing import Any

from trainer.scaling.report import SHARE_LABELS, SHARES, log2_ticks

COLORS = {"wait": "#d62728", "h2d": "#9467bd", "compute": "#2ca02c", "comm_exposed": "#ff7f0e",
          "opt": "#1f77b4", "other": "#bbbbbb"}


def write_chart(path: str, result: dict[str, Any]) -> None:
    """Three panels; one line style per swept value."""
    from matplotlib.figure import Figure  # no pyplot: no global state, less to import

    fig = Figure(figsize=(16, 4.8))
    ax_rate, ax_eff, ax_share = fig.subplots(1, 3)
    markers = "osD^v"
    all_sizes: list[int] = []
    # a token run (--model gpt) is read in tokens/s: its samples are sequences of tokens_per_sample
    tokens = bool(result["variants"] and result["variants"][0].get("tokens_per_sample"))
    for i, v in enumerate(result["variants"]):
        per = (v.get("tokens_per_sample") or 1) if tokens else 1
        tag = "" if v["variant"] is None else f" [{v['variant']}]"
        meas, pred = v["measured"], v.get("curve") or v["predicted"]
        ns = [r["world_size"] for r in meas]
        pn = [r["world_size"] for r in pred]
        all_sizes += ns + pn
        color = f"C{i}"
        if i == 0:
            base = meas[0]
            ideal = [per * base["samples_per_s"] * n / base["world_size"] for n in pn]
            ax_rate.plot(pn, ideal, color="black", linestyle=":", label="ideal (linear)")
        ax_rate.plot(pn, [per * r["samples_per_s"] for r in pred], color=color, linestyle="--", alpha=0.7,
                     label=f"predicted{tag}")
        ax_rate.plot(ns, [per * r["samples_per_s"] for r in meas], color=color, marker=markers[i % 5], linestyle="-",
                     markersize=8, label=f"measured{tag}")
        ax_eff.plot(pn, [100 * r["efficiency"] for r in pred], color=color, linestyle="--", alpha=0.7,
                    label=f"predicted{tag}")
        ax_eff.plot(ns, [100 * r["efficiency"] for r in meas], color=color, marker=markers[i % 5], linestyle="-",
                    markersize=8, label=f"measured{tag}")
        wall = v["walls"]
        for key, style in (("comm_wall_at", "-."), ("data_wall_at", (0, (1, 1)))):
            if wall[key] is not None and i == 0:
                ax_eff.axvline(wall[key], color="grey", linestyle=style, linewidth=1,
                               label=f"{key.split('_')[0]} wall: {wall[key]} ranks")
    ax_eff.axhline(100, color="black", linestyle=":", label="ideal")
    for ax in (ax_rate, ax_eff):
        ax.set_xscale("log", base=2)
        ticks = log2_ticks(all_sizes)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("ranks (world size)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
    ax_rate.set_yscale("log")
    ax_rate.set_ylabel("global tokens/s" if tokens else "global samples/s")
    ax_rate.set_title("throughput")
    ax_eff.set_ylabel("scaling efficiency %")
    ax_eff.set_ylim(0, 110)
    ax_eff.set_title("efficiency = rate(N) / (N x rate(1))")
    _shares(ax_share, result)
    fig.suptitle(f"trainer.scaling: {result['cpu_count']} cores, {result['config']['threads']} thread(s) per rank, "
                 f"link {result['link']['gbps']:.2f} Gbit/s {result['link']['latency_us']:.0f} us/hop "
                 f"({result['link']['source']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def _shares(ax: Any, result: dict[str, Any]) -> None:
    labels, bottoms = [], []
    rows = [(v["variant"], r) for v in result["variants"] for r in v["measured"]]
    for variant, r in rows:
        labels.append(f"N={r['world_size']}" + ("" if variant is None else f"\n{variant}"))
    bottoms = [0.0] * len(rows)
    for p in SHARES:
        heights = [100 * r["stage_share"][p] for _, r in rows]
        ax.bar(range(len(rows)), heights, bottom=bottoms, color=COLORS[p], label=SHARE_LABELS[p])
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("% of step time (all ranks)")
    ax.set_ylim(0, 100)
    ax.set_title("where step time goes (measured)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
