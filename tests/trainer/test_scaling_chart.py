"""scaling.png's throughput panel: samples/s for image runs, tokens/s for token runs (--model gpt)."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.figure import Figure

from trainer.scaling.chart import write_chart
from trainer.scaling.report import SHARES


def _result(tokens_per_sample: int | None) -> dict:
    shares = {p: 1.0 / len(SHARES) for p in SHARES}
    rows = [{"world_size": n, "samples_per_s": 100.0 * n, "efficiency": 1.0, "stage_share": shares} for n in (1, 2)]
    variant = {"variant": None, "measured": rows, "predicted": rows, "curve": rows,
               "walls": {"comm_wall_at": None, "data_wall_at": None}, "tokens_per_sample": tokens_per_sample}
    return {"variants": [variant], "cpu_count": 2, "config": {"threads": 1},
            "link": {"gbps": 10.0, "latency_us": 5.0, "source": "test"}}


@pytest.mark.parametrize(("tokens_per_sample", "label", "top"), [(None, "global samples/s", 200.0),
                                                                 (256, "global tokens/s", 200.0 * 256)])
def test_the_rate_panel_speaks_the_runs_unit(tmp_path: Path, monkeypatch, tokens_per_sample, label, top) -> None:
    figures = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **kw: figures.append(fig) or savefig(fig, *a, **kw))
    write_chart(str(tmp_path / "scaling.png"), _result(tokens_per_sample))
    ax_rate = figures[0].axes[0]  # the figure as saved, read back
    assert ax_rate.get_ylabel() == label
    measured = next(line for line in ax_rate.get_lines() if line.get_label() == "measured")
    assert max(measured.get_ydata()) == top
    assert (tmp_path / "scaling.png").read_bytes()[:4] == b"\x89PNG"
