"""Benchmark: n permutations of one example batched in one forward vs n sequential forwards.

Jain & Wallace permute attention 100 times per example. With ``attnprobe.perturb`` every
batch row draws its own permutation, so ``n`` copies of one example in a batch give ``n``
permutations in one forward. Two contenders, side by side in one run (MiniLM, one 30-token
sentence, every head of one layer permuted):

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
from attnprobe.capture.info import model_scope
from attnprobe.core.scope import Scope
from attnprobe.perturb.context import perturbed
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

    @classmethod
    def smoke(cls) -> Config:
        """Tiny sizes: checks the script end to end in seconds (numbers are meaningless)."""
        return cls(n_permutations=8, repeats=2, warmup=0)


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


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Time both contenders and check they agree; return the tables (nothing is printed)."""
    model, tokenizer = attnprobe.load_model(cfg.model)
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
    return {"summary": summary, "timing": timing, "timing_raw": raw, "checks": checks}


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from harness.runs import analysis_main

    analysis_main("bench_perturb", __doc__, Config, run, argv=argv,
                  show=["summary", "timing", "checks"])


if __name__ == "__main__":
    main()
