"""Benchmark: value zeroing of every token of one layer, batched, vs one full forward per token.

A random ``BertModel`` of MiniLM's shape (6 layers, 384 wide, 12 heads; ``seed``) reads one
random text of ``n_tokens`` tokens. Contenders, interleaved in every repeat so drift on a shared
machine hits both alike:

- ``batched``: :func:`attnprobe.attribution.value_zeroing.value_zeroing` for layer ``layer``:
  one recording forward, then only that layer's block re-run on a batch of copies of its
  cached input, copy ``j`` with token ``j``'s value row zeroed;
- ``one_forward_per_token``: Mohebbi et al. (2023)'s procedure as their code runs it: one plain
  forward, then for each token ``j`` one full forward of the model with a hook zeroing ``j``'s
  value row in layer ``layer``, the layer's output read by a hook; cosine distances and row
  normalisation as in the paper.

Reported: median seconds of each, the ratio batched / one-at-a-time (the issue's target:
≤ 0.3), and how far the two score matrices are apart (they compute the same thing). With
``all_layers`` the batched run over every layer is timed too, against ``layers`` × the
one-layer loop (extrapolated: that loop is not run for every layer).

Run: ``python analyses/bench_value_zeroing.py [--smoke] [--out DIR]`` (~1 min; smoke:
seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from harness.benchmarking import Outcome, interleaved, ratios, timing_table
from harness.runs import analysis_main, torch_threads

from attnprobe.attribution.value_zeroing import value_zeroing
from attnprobe.core.optional import require

VOCAB = 1000
TARGET_RATIO = 0.3


@dataclass
class Config:
    """Sizes of the benchmark (defaults: the full run)."""

    layers: int = 6
    width: int = 384
    heads: int = 12
    n_tokens: int = 32
    layer: int = 3  # the layer whose tokens are zeroed
    dtype: str = "float32"
    threads: int = 1  # torch threads: the contenders are compared on one core
    repeats: int = 5
    warmup: int = 1
    all_layers: bool = True
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        """A 2-layer 32-wide BERT, 8 tokens, one repeat, float64 (so that the two contenders'
        scores agree to rounding): the script end to end; the timings mean nothing."""
        return cls(layers=2, width=32, heads=2, n_tokens=8, layer=1, dtype="float64",
                   repeats=1, warmup=0, all_layers=False)


def bert_model(cfg: Config) -> Any:
    transformers = require("transformers")
    torch.manual_seed(cfg.seed)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=cfg.width, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, intermediate_size=4 * cfg.width,
        max_position_embeddings=max(512, cfg.n_tokens), attn_implementation="sdpa")
    return transformers.BertModel(config).to(getattr(torch, cfg.dtype)).eval()


def random_inputs(cfg: Config) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(5, VOCAB, (1, cfg.n_tokens), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def one_forward_per_token(model: Any, inputs: dict[str, torch.Tensor], layer: int
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's loop: ``([query, key]`` row-normalised scores, ``[query, key]`` raw cosine
    distances) of ``layer``, one full forward per zeroed token."""
    block = model.encoder.layer[layer]
    value = block.attention.self.value
    outputs: list[torch.Tensor] = []
    zero: list[int] = []

    def keep(_module: Any, _args: Any, out: Any) -> None:
        outputs.append((out if isinstance(out, torch.Tensor) else out[0])[0].detach())

    def zero_row(_module: Any, _args: Any, out: torch.Tensor) -> torch.Tensor:
        if zero:
            out = out.clone()
            out[0, zero[0]] = 0
        return out

    handles = [block.register_forward_hook(keep), value.register_forward_hook(zero_row)]
    try:
        with torch.no_grad():
            model(**inputs)
            for j in range(inputs["input_ids"].shape[1]):
                zero[:] = [j]
                model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    original = outputs[0].double()
    distances = torch.stack([1 - torch.nn.functional.cosine_similarity(
        original, altered.double(), dim=-1) for altered in outputs[1:]], dim=1).clamp(min=0)
    return distances / distances.sum(-1, keepdim=True), distances


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Time the contenders side by side and compare their scores (nothing is printed)."""
    with torch_threads(cfg.threads):
        return _run(cfg)


def _run(cfg: Config) -> dict[str, pd.DataFrame]:
    model, inputs = bert_model(cfg), random_inputs(cfg)
    contenders = {
        "batched": lambda: Outcome({}, value_zeroing(model, None, "", layers=[cfg.layer],
                                                     inputs=inputs).scores[0]),
        "one_forward_per_token": lambda: Outcome(
            {}, one_forward_per_token(model, inputs, cfg.layer)[0]),
    }
    if cfg.all_layers:
        contenders["batched_all_layers"] = lambda: Outcome({}, value_zeroing(
            model, None, "", inputs=inputs).scores)
    last: dict[str, Any] = {}
    raw = interleaved(contenders, repeats=cfg.repeats, warmup=cfg.warmup, results=last)
    timing = timing_table(raw, "one_forward_per_token")
    median = timing.set_index("contender")["median_s"]
    shape = f"random BERT {cfg.layers}x{cfg.width}x{cfg.heads}h, {cfg.n_tokens} tokens"
    rows = [{"comparison": f"layer {cfg.layer}: batched vs one forward per zeroed token",
             "model": shape, "contender_s": float(median["batched"]),
             "baseline_s": float(median["one_forward_per_token"]),
             **ratios(raw, "batched", "one_forward_per_token"), "target_ratio": TARGET_RATIO}]
    if cfg.all_layers:
        loop_all = cfg.layers * float(median["one_forward_per_token"])
        rows.append({"comparison": f"all {cfg.layers} layers: batched vs {cfg.layers} x the "
                                   "one-layer loop (extrapolated)",
                     "model": shape, "contender_s": float(median["batched_all_layers"]),
                     "baseline_s": loop_all,
                     "ratio_of_medians": float(median["batched_all_layers"]) / loop_all,
                     "target_ratio": TARGET_RATIO})
    summary = pd.DataFrame(rows)
    _, distances = one_forward_per_token(model, inputs, cfg.layer)
    gap = (last["batched"] - last["one_forward_per_token"]).abs().max()
    checks = pd.DataFrame([
        {"check": "tokens", "value": float(cfg.n_tokens)},
        {"check": "max |batched - one forward per token| (normalised scores)",
         "value": float(gap)},
        {"check": "min cosine distance (one forward per token)", "value": float(distances.min())},
        {"check": "batched rows sum to 1 (max |sum - 1|)",
         "value": float((last["batched"].sum(-1) - 1).abs().max())},
        {"check": "ratio of medians within the target (1 = yes)",
         "value": float(summary["ratio_of_medians"].iloc[0] <= TARGET_RATIO)},
    ])
    setup = pd.DataFrame([{"torch_threads": cfg.threads, "dtype": cfg.dtype,
                           "repeats": cfg.repeats, "layer": cfg.layer,
                           "foreign_load": float(raw["foreign_load"].mean())}])
    return {"summary": summary, "checks": checks, "setup": setup, "timing": timing,
            "timing_raw": raw}


def main(argv: list[str] | None = None) -> None:
    analysis_main("bench_value_zeroing", __doc__, Config, run, argv=argv,
                  show=["summary", "checks", "setup", "timing"])


if __name__ == "__main__":
    main()
