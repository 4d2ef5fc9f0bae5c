"""Benchmark: attention flow at 128 tokens, attnprobe (scipy) vs a networkx per-pair max-flow.

Input: the MiniLM attention maps (all 6 layers) of one text of exactly ``seq_len`` word pieces
(the first sentences of ``data/census_sentences.txt`` joined and cut to ``seq_len`` tokens,
``[CLS]`` and ``[SEP]`` included). Flow runs from ``[CLS]`` after the last layer to the input
tokens, through the layered graph of residual-augmented head-mean attention (Abnar & Zuidema
2020).

Contenders, measured side by side on the same map in the same process (interleaved: ours,
networkx, ours, ...; networkx takes ~30 s per pair at 128 tokens, so it runs in the first
``networkx_repeats`` rounds only, ours in all ``repeats``):

- **ours**: :func:`attnprobe.attribution.attention_flow.flow`'s internals — one CSR graph of
  integer capacities (``FLOW_SCALE``) built per example, one
  ``scipy.sparse.csgraph.maximum_flow`` (Dinic) per input node.
- **networkx**: Abnar & Zuidema's ``attention_graph_util.py`` construction — a ``DiGraph``
  from the dense ``(L+1)·n`` adjacency matrix with float capacities, then
  ``networkx.maximum_flow_value(G, source, v, flow_func=edmonds_karp)`` per input node.

networkx on all ``seq_len`` inputs is too slow to repeat, so both time the same ``subset``
input nodes (evenly spaced, ``[CLS]`` and ``[SEP]`` included), graph build included, and the
headline is the per-pair ratio networkx / ours. Ours is also timed on all inputs through the
public ``views.flow`` (and over every layer, as ``attention_importance`` runs it), and the
networkx time for all inputs is extrapolated from its per-pair time. Both must give the same
flow values on the subset (max relative difference, checked against ``tolerance``).

Run: ``python analyses/bench_flow.py [--smoke] [--out DIR]`` (~4 min; smoke: seconds); tables
and ``provenance.json`` go to ``runs/bench_flow/<UTC stamp>/``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from harness.benchmarking import Outcome, interleaved, timing_table
from harness.runs import analysis_main

import attnprobe
from attnprobe.attribution import attention_flow, view_common, views
from attnprobe.core.lines import split_lines

DATA = Path(__file__).resolve().parent / "data" / "census_sentences.txt"


@dataclass
class Config:
    """Sizes of the benchmark (defaults: the full run)."""

    model: str = "minilm"
    seq_len: int = 128
    subset: int = 8  # input nodes both contenders time
    repeats: int = 5  # timed rounds of ours, after one untimed warm-up
    networkx_repeats: int = 1  # rounds that also time networkx (~30 s per pair at 128 tokens)
    all_layers: bool = True  # also time ours over every layer (attention_importance's cost)
    tolerance: float = 1e-6  # max relative difference ours vs networkx on the subset

    @classmethod
    def smoke(cls) -> Config:
        """Tiny sizes: checks the script end to end in seconds (numbers are meaningless)."""
        return cls(seq_len=16, subset=4, repeats=1, networkx_repeats=1, all_layers=False)


# ----------------------------------------------------------------------------- inputs
def _text(tokenizer: Any, seq_len: int) -> str:
    """Enough sentences to fill ``seq_len`` word pieces."""
    text = ""
    for line in split_lines(DATA.read_text(encoding="utf-8")):
        text = f"{text} {line.strip()}".strip()
        if len(tokenizer(text)["input_ids"]) > seq_len:
            return text
    raise ValueError(f"{DATA} has fewer than {seq_len} tokens")


def _map(cfg: Config) -> attnprobe.AttentionMap:
    model, tokenizer = attnprobe.load_model(cfg.model)
    text = _text(tokenizer, cfg.seq_len)
    amap = attnprobe.extract(model, tokenizer, [text], max_length=cfg.seq_len,
                             truncation=True)[0]
    if amap.shape[-1] != cfg.seq_len:
        raise ValueError(f"expected a {cfg.seq_len}-token map; got shape {amap.shape}")
    return amap


def _sinks(n: int, subset: int) -> list[int]:
    return sorted({round(float(x)) for x in np.linspace(0, n - 1, min(subset, n))})


# ----------------------------------------------------------------------------- contenders
def _ours(amap: attnprobe.AttentionMap, sinks: list[int]) -> np.ndarray:
    """Unnormalised flow values (weight units) from [CLS] after the last layer to ``sinks``."""
    from scipy.sparse.csgraph import maximum_flow

    aug = view_common.augmented(amap, residual=True, head_reduce="mean")
    graph = attention_flow.flow_graph(aug)
    n = amap.shape[-1]
    source = aug.shape[0] * n  # node (last layer, row 0)
    values = [maximum_flow(graph, source, v).flow_value for v in sinks]
    return np.asarray(values, dtype=np.float64) / attention_flow.FLOW_SCALE


def _networkx(amap: attnprobe.AttentionMap, sinks: list[int]) -> tuple[np.ndarray, float]:
    """Abnar & Zuidema's per-pair networkx flow; returns the values and the build seconds."""
    import networkx as nx

    start = time.perf_counter()
    p = amap.pattern.double().mean(1).numpy()  # [layer, query, key]
    n_layers, n, _ = p.shape
    aug = p + np.eye(n)
    aug = aug / aug.sum(-1, keepdims=True)
    adj = np.zeros(((n_layers + 1) * n, (n_layers + 1) * n))
    for layer in range(1, n_layers + 1):
        adj[layer * n:(layer + 1) * n, (layer - 1) * n:layer * n] = aug[layer - 1]
    graph = nx.from_numpy_array(adj, create_using=nx.DiGraph(), edge_attr="capacity")
    built = time.perf_counter()
    source = n_layers * n
    values = [nx.maximum_flow_value(graph, source, v, flow_func=nx.algorithms.flow.edmonds_karp)
              for v in sinks]
    return np.asarray(values, dtype=np.float64), built - start


# ----------------------------------------------------------------------------- run
def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Time both contenders on the same map; return the tables (nothing is printed)."""
    amap = _map(cfg)
    n, n_layers = amap.shape[-1], amap.shape[0]
    top = amap.layers[-1]
    sinks = _sinks(n, cfg.subset)
    nan = float("nan")
    subset = {"pairs": len(sinks), "build_s": nan}
    ours_name, nx_name = f"ours, {len(sinks)} inputs", f"networkx, {len(sinks)} inputs"
    full_name = f"ours, all {n} inputs (views.flow)"

    def networkx() -> Outcome:
        values, build = _networkx(amap, sinks)
        return Outcome({**subset, "build_s": build}, values)

    def all_layers() -> dict[str, float]:
        for layer in amap.layers:
            views.flow(amap, layer=layer, query="cls")
        return {"pairs": n * n_layers, "build_s": nan}

    contenders = {
        ours_name: lambda: Outcome(subset, _ours(amap, sinks)),
        nx_name: networkx,
        full_name: lambda: Outcome({"pairs": n, "build_s": nan},
                                   views.flow(amap, layer=top, query="cls")),
    }
    if cfg.all_layers:
        contenders[f"ours, all {n} inputs x {n_layers} layers"] = all_layers
    last: dict[str, Any] = {}  # one untimed warm-up round (imports, caches); networkx skips it
    raw = interleaved(contenders, repeats=cfg.repeats, warmup=1, results=last,
                      only_first={nx_name: cfg.networkx_repeats})
    ours_vals, nx_vals, full = last[ours_name], last[nx_name], last[full_name]
    timing = timing_table(raw, medians=["build_s"])
    timing.insert(5, "pairs", raw.groupby("contender", sort=False)["pairs"].first().to_numpy())
    timing["per_pair_ms"] = 1000 * timing["median_s"] / timing["pairs"]

    ours_sub = raw[raw["contender"].str.startswith("ours, ") & (raw["pairs"] == len(sinks))
                   & ~raw["contender"].str.contains("all")]
    nx_sub = raw[raw["contender"].str.startswith("networkx")]
    ours_pair = statistics.median(ours_sub["seconds"]) / len(sinks)
    nx_pair = statistics.median(nx_sub["seconds"]) / len(sinks)
    nx_build = statistics.median(nx_sub["build_s"])
    nx_pair_solve = (statistics.median(nx_sub["seconds"]) - nx_build) / len(sinks)
    ours_all = float(timing.loc[timing["contender"].str.contains(r"views\.flow"),
                                "median_s"].iloc[0])
    nx_all_estimate = nx_build + nx_pair_solve * n

    rel = np.abs(ours_vals - nx_vals) / np.maximum(np.abs(nx_vals), 1e-12)
    flows = pd.DataFrame({"input_pos": sinks, "token": [amap.key_tokens[v] for v in sinks],
                          "ours": ours_vals, "networkx": nx_vals, "rel_diff": rel,
                          "ours_normalised": full.numpy()[sinks]})
    checks = pd.DataFrame([
        {"check": "tokens in the map", "value": float(n)},
        {"check": "layers in the map", "value": float(n_layers)},
        {"check": "max relative difference ours vs networkx (subset)", "value": float(rel.max())},
        {"check": "ours and networkx agree within tolerance",
         "value": float(rel.max() <= cfg.tolerance)},
        {"check": "ours normalised flow sums to 1 (all inputs)", "value": float(full.sum())},
    ])
    summary = pd.DataFrame([
        {"measure": f"per pair, {len(sinks)} inputs (graph build included)",
         "ours_s": ours_pair, "networkx_s": nx_pair,
         "ratio_networkx_over_ours": nx_pair / ours_pair},
        {"measure": f"all {n} inputs from [CLS] of layer {top} (networkx extrapolated)",
         "ours_s": ours_all, "networkx_s": nx_all_estimate,
         "ratio_networkx_over_ours": nx_all_estimate / ours_all},
    ])
    return {"timing": timing, "timing_raw": raw, "flows": flows, "checks": checks,
            "summary": summary}


def main(argv: list[str] | None = None) -> None:
    analysis_main("bench_flow", __doc__, Config, run, argv=argv,
                  show=["timing", "flows", "checks", "summary"])


if __name__ == "__main__":
    main()
