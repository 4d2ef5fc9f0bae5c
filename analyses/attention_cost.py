"""Cost of attention mechanisms, measured side by side in one run.

1. Scoring functions for one decoder query over a source (the seeds claim Luong's dot score is
   1.5–2× faster than Bahdanau's additive score): median time of dot, general and additive
   scoring at several source lengths, and the ratio additive / dot.
2. One attention layer (batch 1, ``d_model`` 64, 4 heads) as the length grows to 8,192: full
   softmax attention vs sliding-window attention vs linear attention (ELU+1), median time and
   peak resident memory above the pre-call level, with ratios to full attention.

Run: ``python analyses/attention_cost.py [--smoke] [--out DIR]``; tables, a plot and
``provenance.json`` go to ``runs/attention_cost/<UTC stamp>/``.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from harness.runs import analysis_main, memory_status_kib, reset_peak_rss

from attnprobe.models.attention import MultiHeadAttention
from attnprobe.models.linear_attention import LinearAttention
from attnprobe.models.rnn_attention import AdditiveScore, DotScore, GeneralScore
from attnprobe.models.sparse import SlidingWindowAttention

SEED_CLAIM = "Luong dot scoring 1.5–2× faster than Bahdanau additive (seeds)"


@dataclass
class Config:
    score_batch: int = 64
    score_dim: int = 256
    score_lengths: tuple[int, ...] = (10, 50, 200)
    score_seconds: float = 0.5
    layer_lengths: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
    layer_repeats: int = 3
    d_model: int = 64
    n_heads: int = 4
    window: int = 128
    layers: tuple[str, ...] = field(default=("full", "sliding-window", "linear"))
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        return cls(score_batch=4, score_dim=16, score_lengths=(10,), score_seconds=0.02,
                   layer_lengths=(64, 128), layer_repeats=1, window=8)


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def scoring_table(cfg: Config) -> pd.DataFrame:
    """Median time per call of each score function (``torch.utils.benchmark``, which warms
    up and repeats until ``score_seconds`` per measurement), at each source length."""
    from torch.utils import benchmark

    gen = torch.Generator().manual_seed(cfg.seed)
    d = cfg.score_dim
    scorers = {"luong-dot": DotScore(), "luong-general": GeneralScore(d, d),
               "bahdanau-additive": AdditiveScore(d, d, d)}
    rows = []
    with torch.no_grad():
        for length in cfg.score_lengths:
            query = torch.randn(cfg.score_batch, d, generator=gen)
            keys = torch.randn(cfg.score_batch, length, d, generator=gen)
            medians = {}
            for name, scorer in scorers.items():
                timer = benchmark.Timer(stmt="scorer(query, keys)",
                                        globals={"scorer": scorer, "query": query, "keys": keys})
                medians[name] = timer.blocked_autorange(min_run_time=cfg.score_seconds).median
            for name, median in medians.items():
                rows.append({"source_length": length, "score": name, "median_us": 1e6 * median,
                             "ratio_to_dot": median / medians["luong-dot"]})
    return pd.DataFrame(rows)


def _layer(name: str, cfg: Config) -> torch.nn.Module:
    if name == "full":
        return MultiHeadAttention(cfg.d_model, cfg.n_heads)
    if name == "sliding-window":
        return SlidingWindowAttention(cfg.d_model, cfg.n_heads, cfg.window)
    if name == "linear":
        return LinearAttention(cfg.d_model, cfg.n_heads)
    raise ValueError(f"unknown layer {name!r}")


def layer_table(cfg: Config) -> pd.DataFrame:
    """Median time and peak memory of one forward of each layer at each length."""
    torch.manual_seed(cfg.seed)
    layers = {name: _layer(name, cfg).eval() for name in cfg.layers}
    rows = []
    with torch.no_grad():
        for length in cfg.layer_lengths:
            x = torch.randn(1, length, cfg.d_model)
            for name, layer in layers.items():
                seconds = _median_seconds(lambda layer=layer, x=x: layer(x), cfg.layer_repeats)
                gc.collect()
                exact = reset_peak_rss()
                before = memory_status_kib()["VmRSS"]
                layer(x)
                peak = memory_status_kib()["VmHWM"]
                # below ~1 MiB the allocator reuses freed heap, so the reading is only a bound
                above = max(0.0, (peak - before) / 1024) if exact else float("nan")
                rows.append({"length": length, "layer": name, "median_s": seconds,
                             "peak_above_mib": above})
    table = pd.DataFrame(rows)
    full = table[table["layer"] == "full"].set_index("length")
    table["time_ratio_to_full"] = table["median_s"] / table["length"].map(full["median_s"])
    full_mib = table["length"].map(full["peak_above_mib"])
    table["memory_ratio_to_full"] = (table["peak_above_mib"] / full_mib).where(full_mib >= 1.0)
    return table


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Both measurements as tidy tables (nothing is printed)."""
    scoring = scoring_table(cfg)
    layers = layer_table(cfg)
    longest = layers[layers["length"] == layers["length"].max()]
    additive = scoring[scoring["score"] == "bahdanau-additive"]
    summary = pd.DataFrame([
        {"measure": "additive / dot scoring time (median over lengths)",
         "ours": float(additive["ratio_to_dot"].median()), "seeds": SEED_CLAIM},
        *({"measure": f"{row.layer} / full time at {row.length}", "ours": row.time_ratio_to_full,
           "seeds": ""} for row in longest.itertuples() if row.layer != "full"),
        *({"measure": f"{row.layer} / full peak memory at {row.length}",
           "ours": row.memory_ratio_to_full, "seeds": ""}
          for row in longest.itertuples() if row.layer != "full"),
    ])
    return {"scoring": scoring, "layers": layers, "summary": summary}


def plot(tables: dict[str, pd.DataFrame], path: Path) -> Path:
    """Time and memory against length, log-log, one line per layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = tables["layers"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, sub in layers.groupby("layer", sort=False):
        axes[0].plot(sub["length"], sub["median_s"], marker="o", label=name)
        axes[1].plot(sub["length"], sub["peak_above_mib"], marker="o", label=name)
    for ax, label in zip(axes, ("median seconds", "peak memory above start (MiB)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("symlog", linthresh=1.0)  # memory can be 0 (under the resolution)
        ax.set_xlabel("sequence length")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle("One attention layer, batch 1, d_model 64, 4 heads (CPU)")
    fig.tight_layout()
    out = path / "cost.png"
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    analysis_main("attention_cost", __doc__, Config, run, plot, argv)


if __name__ == "__main__":
    main()
