"""Benchmarks: a per-head ablation sweep vs one run per head, and n permutations of one
example batched in one forward vs n sequential forwards.

**Per-head sweep.** Ablating every head of MiniLM alone (6 × 12 = 72 heads) on the same
texts (by default the one 30-token sentence below), two contenders side by side:

- ``sweep``: one ``ap.perturb.run(model, tok, texts, "ablate", sweep="head")`` — the text
  batch repeated once per head in each forward, ``batch_size`` (16) rows per forward, the
  unperturbed output computed once;
- ``sequential``: 72 calls ``ap.perturb.run(model, tok, texts, "ablate", scope="head:L.H")``
  (what a user wrote before sweeps existed).

The run checks that both give the same table (same rows, columns and order; numbers equal up
to float rounding between batch shapes) and reports the largest difference. Target: the sweep
takes at most 1/5 of the time. The saving comes from sharing the unperturbed forward (and the
output-kind forward) of each text batch over all heads and from larger, more efficient
forwards; the perturbed rows themselves cost what they cost, so with many texts per run
(where the sequential runs batch their texts too) the ratio tends towards about 1/2: for
``n`` texts the sweep runs ``72n + n + 1`` text forwards, the 72 runs ``72 (2n + 1)``.

**Permutations.** Jain & Wallace permute attention 100 times per example. With
``attnprobe.perturb`` every batch row draws its own permutation, so ``n`` copies of one
example in a batch give ``n`` permutations in one forward. Two contenders, side by side in one
run (MiniLM, one 30-token sentence, every head of one layer permuted):

- ``batched``: one ``perturbed(model, Permute(), "layer:L")`` context, one forward of ``n``
  copies;
- ``sequential``: one context with the same seed, ``n`` forwards of the single example.

A third row times the plain (unperturbed) forward of the ``n`` copies, for reference: the cost
of the perturbation itself (``batched / plain``).

Both consume the generator identically (a batch of ``n`` draws exactly what ``n`` batches of 1
draw, in order), so they apply the same permutations: the run checks that the edited weights
and the outputs agree (up to float rounding between batch sizes), and that the ``n`` batched
outputs are all different. The timed region is entering the context, the forward(s) and
leaving it, under ``torch.no_grad()``; contenders are interleaved (A, B, A, B, ...) and the
medians of ``repeats`` timed rounds (after ``warmup`` untimed ones) are compared.

The sequential sweep contender is slow, so it runs only in the timed rounds (the sweep's
warm-up round, first, warms the model up); the tables of the last round are compared.

Run: ``python analyses/bench_perturb.py [--smoke] [--out DIR]``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from harness.benchmarking import interleaved, ratios, timing_table, with_result

import attnprobe
from attnprobe.capture.info import attention_sizes, model_scope
from attnprobe.core.scope import Scope
from attnprobe.perturb.context import perturbed
from attnprobe.perturb.experiments import run as perturb_run
from attnprobe.perturb.interventions import Permute
from attnprobe.perturb.measures import cosine_distance

SENTENCE = ("The old man who lived near the quiet river walked slowly to the busy market every "
            "morning to buy warm bread and cheese for his three grandchildren.")  # 30 tokens


@dataclass
class Config:
    """Sizes of the benchmark (defaults: the full run)."""

    model: str = "minilm"
    sentence: str = SENTENCE
    layer: int = 3
    n_permutations: int = 100
    repeats: int = 7
    warmup: int = 1
    seed: int = 0
    sweep_scope: str = "all"  # the heads ablated one at a time (all: 72 on MiniLM)
    sweep_texts: tuple[str, ...] = (SENTENCE,)
    sweep_batch_size: int = 16  # run()'s default: rows per forward
    sweep_repeats: int = 3

    @classmethod
    def smoke(cls) -> Config:
        """Tiny sizes: checks the script end to end in seconds (numbers are meaningless)."""
        return cls(n_permutations=8, repeats=2, warmup=0, sweep_scope="heads:4.3,5.0,5.11",
                   sweep_repeats=1)


def _pooled(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sentence-transformers mean pooling ``[batch, seq, d] -> [batch, d]``."""
    weights = mask[..., None].to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1)


def _batched(model: Any, copies: dict, scope: Scope, seed: int, keep: bool = False
             ) -> Callable[[], tuple[torch.Tensor, Any]]:
    def go() -> tuple[torch.Tensor, Any]:
        with perturbed(model, Permute(), scope, seed=seed, keep=keep) as cap:
            hidden = model(**copies).last_hidden_state
        return hidden, cap
    return go


def _sequential(model: Any, single: dict, n: int, scope: Scope, seed: int, keep: bool = False
                ) -> Callable[[], tuple[torch.Tensor, Any]]:
    def go() -> tuple[torch.Tensor, Any]:
        with perturbed(model, Permute(), scope, seed=seed, keep=keep) as cap:
            hidden = torch.cat([model(**single).last_hidden_state for _ in range(n)])
        return hidden, cap
    return go


def _sweep(model: Any, tokenizer: Any, cfg: Config) -> Callable[[], pd.DataFrame]:
    def go() -> pd.DataFrame:
        return perturb_run(model, tokenizer, list(cfg.sweep_texts), "ablate",
                           scope=cfg.sweep_scope, sweep="head", batch_size=cfg.sweep_batch_size)
    return go


def _one_per_head(model: Any, tokenizer: Any, cfg: Config, heads: list[tuple[int, int]]
                  ) -> Callable[[], pd.DataFrame]:
    def go() -> pd.DataFrame:
        return pd.concat([perturb_run(model, tokenizer, list(cfg.sweep_texts), "ablate",
                                      scope=f"head:{layer}.{head}",
                                      batch_size=cfg.sweep_batch_size)
                          for layer, head in heads], ignore_index=True)
    return go


def sweep_benchmark(model: Any, tokenizer: Any, cfg: Config) -> dict[str, pd.DataFrame]:
    """The per-head ablation sweep vs one run per head (module docstring)."""
    scope = model_scope(model, cfg.sweep_scope)
    n_layers, n_heads = attention_sizes(model)
    heads = [(layer, head) for layer in scope.layers_in(n_layers)
             for head in scope.heads_of(layer, n_heads)]
    sweep = f"sweep: 1 run, sweep='head' ({len(heads)} heads)"
    sequential = f"sequential: {len(heads)} runs, scope='head:L.H'"
    contenders = {sweep: _sweep(model, tokenizer, cfg),
                  sequential: _one_per_head(model, tokenizer, cfg, heads)}
    results: dict[str, Any] = {}
    with torch.no_grad():  # the sweep warms up once; the slow sequential runs only when timed
        raw = interleaved({name: with_result(fn) for name, fn in contenders.items()},
                          repeats=cfg.sweep_repeats, warmup=1, results=results,
                          only_first={sequential: cfg.sweep_repeats})
    swept, one_by_one = results[sweep], results[sequential]  # the last tables, compared
    numbers = ["baseline", "perturbed", "change"]
    labels = swept.drop(columns=numbers)
    same_labels = labels.equals(one_by_one.drop(columns=numbers))
    difference = (swept[numbers] - one_by_one[numbers]).abs().max().max()
    grid = swept[swept["metric"] == "cosine_distance"].pivot_table(
        index="layer", columns="head", values="change", aggfunc="median")
    timing = timing_table(raw)
    med = timing.set_index("contender")["median_s"]
    ratio = ratios(raw, sweep, sequential)
    n_texts = len(cfg.sweep_texts)
    summary = pd.DataFrame([{
        "benchmark": f"{len(heads)} single-head ablations ({cfg.model}, {n_texts} text(s), "
                     f"batch_size {cfg.sweep_batch_size})",
        "sweep_s": float(med[sweep]), "sequential_s": float(med[sequential]),
        "ratio (sweep / sequential)": ratio["ratio_of_medians"],
        "median_paired_ratio": ratio["median_paired_ratio"], "target": 0.2,
        "foreign_load": float(raw["foreign_load"].mean()),
    }])
    checks = pd.DataFrame([
        {"check": "heads swept", "value": float(len(heads))},
        {"check": "rows: sweep table", "value": float(len(swept))},
        {"check": "rows: sequential tables", "value": float(len(one_by_one))},
        {"check": "same columns and rows in the same order (1 = yes)",
         "value": float(same_labels and list(swept.columns) == list(one_by_one.columns))},
        {"check": "max |sweep - sequential| baseline / perturbed / change",
         "value": float(difference)},
        {"check": "heads in the sweep's layer x head grid of cosine distances",
         "value": float(grid.count().sum())},
    ])
    return {"sweep_summary": summary, "sweep_timing": timing, "sweep_timing_raw": raw,
            "sweep_checks": checks, "sweep_table": swept}


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Time both benchmarks' contenders and check they agree; return the tables (nothing is
    printed)."""
    model, tokenizer = attnprobe.load_model(cfg.model)
    swept = sweep_benchmark(model, tokenizer, cfg)
    single = dict(tokenizer([cfg.sentence], return_tensors="pt"))
    single = {k: single[k] for k in ("input_ids", "attention_mask")}
    n = cfg.n_permutations
    copies = {k: v.expand(n, -1).contiguous() for k, v in single.items()}
    scope = model_scope(model, Scope(layers=(cfg.layer,)))
    batched = f"batched: 1 forward of {n} copies"
    sequential = f"sequential: {n} forwards of 1"
    plain_name = f"reference: plain forward of {n} copies, no perturbation"

    with torch.no_grad():  # outputs are freed after each measurement, not inside it
        raw = interleaved({
            batched: with_result(_batched(model, copies, scope, cfg.seed)),
            sequential: with_result(_sequential(model, single, n, scope, cfg.seed)),
            plain_name: with_result(lambda: model(**copies).last_hidden_state),
        }, repeats=cfg.repeats, warmup=cfg.warmup)
        # untimed: the same draws give the same permutations and outputs
        out_b, cap_b = _batched(model, copies, scope, cfg.seed, keep=True)()
        out_s, cap_s = _sequential(model, single, n, scope, cfg.seed, keep=True)()
        plain = model(**single).last_hidden_state
    weights_b = torch.stack([m.pattern for m in cap_b.maps])  # [n, 1, head, q, k], edited
    weights_s = torch.stack([m.pattern for m in cap_s.maps])
    emb_b = _pooled(out_b, copies["attention_mask"])
    emb_s = _pooled(out_s, copies["attention_mask"])
    emb_plain = _pooled(plain, single["attention_mask"])
    distance = cosine_distance(emb_b, emb_plain.expand_as(emb_b))
    distinct = len({tuple(row.tolist()) for row in emb_b.round(decimals=5)})

    timing = timing_table(raw)
    timing["per_permutation_ms"] = 1000 * timing["median_s"] / n
    med = timing.set_index("contender")["median_s"]
    speedup = ratios(raw, sequential, batched)
    summary = pd.DataFrame([{
        "benchmark": f"{n} permutations of layer {cfg.layer} ({cfg.model}, "
                     f"{single['input_ids'].shape[1]} tokens)",
        "batched_s": float(med[batched]), "sequential_s": float(med[sequential]),
        "speedup (sequential / batched)": speedup["ratio_of_medians"],
        "median_paired_speedup": speedup["median_paired_ratio"],
        "plain_batched_s": float(med[plain_name]),
        "batched / plain": float(med[batched] / med[plain_name]),
        "foreign_load": float(raw["foreign_load"].mean()),
    }])
    checks = pd.DataFrame([
        {"check": "tokens in the sentence", "value": float(single["input_ids"].shape[1])},
        {"check": "max |batched - sequential| permuted weights",
         "value": float((weights_b - weights_s).abs().max())},
        {"check": "same argmax key in every permuted row (1 = yes)",
         "value": float(torch.equal(weights_b.argmax(-1), weights_s.argmax(-1)))},
        {"check": "max |batched - sequential| last hidden state",
         "value": float((out_b - out_s).abs().max())},
        {"check": "max |batched - sequential| embedding",
         "value": float((emb_b - emb_s).abs().max())},
        {"check": "distinct embeddings among the batched permutations",
         "value": float(distinct)},
        {"check": "median cosine distance to the unperturbed embedding",
         "value": float(distance.median())},
        {"check": "max cosine distance to the unperturbed embedding",
         "value": float(distance.max())},
        {"check": "torch threads", "value": float(torch.get_num_threads())},
    ])
    return {**swept, "summary": summary, "timing": timing, "timing_raw": raw,
            "checks": checks}


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from harness.runs import analysis_main

    analysis_main("bench_perturb", __doc__, Config, run, argv=argv,
                  show=["sweep_summary", "sweep_timing", "sweep_checks", "summary", "timing",
                        "checks"])


if __name__ == "__main__":
    main()
