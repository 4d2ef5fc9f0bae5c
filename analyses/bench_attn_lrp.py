"""Benchmark: AttnLRP (``attn_lrp``) against one plain forward + backward, and its conservation.

A random float32 ``BertForSequenceClassification`` (6 layers, 384 wide, 12 heads, MiniLM's
shape, SDPA-loaded), ``n_texts`` random texts of ``n_tokens`` tokens, target ``class:1``.
Contenders, interleaved in every repeat so drift on a shared machine hits both:

- ``attn_lrp``: :class:`attnprobe.attribution.attn_lrp.AttnLRP` ``.explain`` per text (the
  rules installed, one forward with explicit attention matmuls, one backward, restored);
- ``forward_backward``: what input × gradient costs at least — one forward of the model as
  loaded (SDPA) and one ``torch.autograd.grad`` to the word embeddings' output, per text.

Reported: per-text median time of each, the ratio (the issue's target: ≤ 3×), and the
conservation of AttnLRP — the share ``Σ R / f(x)`` of the explained logit the input relevance
keeps — on the BERT texts and on a tiny random LLaMA (next-token logit; the reference
implementation LXT keeps about 72 % there).

Run: ``python analyses/bench_attn_lrp.py [--smoke] [--out DIR]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from harness.benchmarking import Outcome, interleaved, ratios, timing_table
from harness.runs import analysis_main

from attnprobe.attribution.attn_lrp import AttnLRP
from attnprobe.attribution.method_base import Problem
from attnprobe.attribution.methods import embedding_layer
from attnprobe.attribution.targets import Target, parse_target
from attnprobe.core.optional import require


@dataclass
class Config:
    """Sizes of the benchmark (defaults: the full run)."""

    layers: int = 6
    width: int = 384
    heads: int = 12
    n_tokens: int = 64
    n_texts: int = 8
    repeats: int = 5
    warmup: int = 1
    llama_width: int = 64
    llama_layers: int = 2
    llama_texts: int = 16
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        """A 2-layer 64-wide BERT, 16 tokens, two texts, one repeat: the script end to end."""
        return cls(layers=2, width=64, heads=4, n_tokens=16, n_texts=2, repeats=1, warmup=0,
                   llama_texts=2)


VOCAB = 1000


def _bert(cfg: Config) -> Any:
    transformers = require("transformers")
    torch.manual_seed(cfg.seed)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=cfg.width, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, intermediate_size=4 * cfg.width, num_labels=2,
        max_position_embeddings=max(512, cfg.n_tokens), attn_implementation="sdpa")
    return transformers.BertForSequenceClassification(config).eval()


def _llama(cfg: Config) -> Any:
    transformers = require("transformers")
    torch.manual_seed(cfg.seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=cfg.llama_width, intermediate_size=4 * cfg.llama_width,
        num_hidden_layers=cfg.llama_layers, num_attention_heads=4, num_key_value_heads=2,
        attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(config).eval()


def _texts(n: int, n_tokens: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(5, VOCAB, (1, n_tokens), generator=gen) for _ in range(n)]


def _problems(model: Any, target: Target, texts: list[torch.Tensor]) -> list[Problem]:
    """One Problem per text, the target fixed on a plain forward (outside the timing)."""
    layer = embedding_layer(model)
    problems = []
    for ids in texts:
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        with torch.no_grad():
            output = model(**inputs)
        fixed = target.fixed(output, inputs)
        value = float(fixed(output, inputs)[0])
        problems.append(Problem(model, inputs, fixed, value,
                                torch.zeros(ids.shape[1], dtype=torch.bool), 0, 0, layer))
    return problems


def _forward_backward(problem: Problem) -> torch.Tensor:
    """Input × gradient at its cheapest: one forward, one backward to the embedding output."""
    seen: list[torch.Tensor] = []

    def leaf(_module: Any, _inputs: Any, out: torch.Tensor) -> torch.Tensor:
        seen.append(out.detach().requires_grad_(True))
        return seen[-1]

    handle = problem.layer().register_forward_hook(leaf)
    try:
        with torch.enable_grad():
            value = problem.forward(problem.ids, problem.inputs["attention_mask"])[0]
            (grad,) = torch.autograd.grad(value, seen[0])
    finally:
        handle.remove()
    return (seen[0].detach() * grad).sum(-1)[0]


def _contender(problems: list[Problem], fn: Callable[[Problem], Any]) -> Callable[[], Outcome]:
    return lambda: Outcome({}, [fn(p) for p in problems])


def _kept(problems: list[Problem], model_name: str) -> list[dict[str, Any]]:
    rows = []
    for i, problem in enumerate(problems):
        scores, gap = AttnLRP().explain(problem)
        logit = float(scores.sum()) - gap
        rows.append({"model": model_name, "example_id": str(i), "logit": logit,
                     "sum_relevance": float(scores.sum()), "gap": gap,
                     "share_kept": float(scores.sum()) / logit})
    return rows


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Time the contenders side by side and measure conservation (nothing is printed)."""
    bert = _bert(cfg)
    target = parse_target("class:1", bert, None)
    problems = _problems(bert, target, _texts(cfg.n_texts, cfg.n_tokens, cfg.seed))
    contenders = {"attn_lrp": _contender(problems, lambda p: AttnLRP().explain(p).scores),
                  "forward_backward": _contender(problems, _forward_backward)}
    last: dict[str, Any] = {}
    raw = interleaved(contenders, repeats=cfg.repeats, warmup=cfg.warmup, results=last)
    raw["seconds_per_text"] = raw["seconds"] / len(problems)
    timing = timing_table(raw, "forward_backward", value="seconds_per_text", suffix="s_per_text")
    ratio = ratios(raw, "attn_lrp", "forward_backward")
    summary = pd.DataFrame([{
        "comparison": "attn_lrp vs one forward + backward",
        "model": f"random BERT {cfg.layers}x{cfg.width}, {cfg.n_tokens} tokens",
        "attn_lrp_s_per_text": float(timing.set_index("contender").loc[
            "attn_lrp", "median_s_per_text"]),
        "forward_backward_s_per_text": float(timing.set_index("contender").loc[
            "forward_backward", "median_s_per_text"]),
        **ratio, "target_ratio": 3.0}])

    llama = _llama(cfg)
    next_token = parse_target("next-token", llama, None)
    kept = pd.DataFrame(
        _kept(problems, "bert") + _kept(_problems(llama, next_token, _texts(
            cfg.llama_texts, cfg.n_tokens, cfg.seed + 1)), f"llama {cfg.llama_layers}x"
            f"{cfg.llama_width}"))
    conservation = kept.groupby("model", sort=False).agg(
        texts=("share_kept", "size"), median_share_kept=("share_kept", "median"),
        mean_share_kept=("share_kept", "mean"), min_share_kept=("share_kept", "min"),
        max_share_kept=("share_kept", "max")).reset_index()
    setup = pd.DataFrame([{"torch_threads": torch.get_num_threads(), "repeats": cfg.repeats,
                           "texts": len(problems), "tokens": cfg.n_tokens,
                           "foreign_load": float(raw["foreign_load"].mean())}])
    return {"summary": summary, "conservation": conservation, "setup": setup,
            "timing": timing, "timing_raw": raw, "kept": kept}


def main(argv: list[str] | None = None) -> None:
    analysis_main("bench_attn_lrp", __doc__, Config, run, argv=argv,
                  show=["summary", "conservation", "setup", "timing"])


if __name__ == "__main__":
    main()
