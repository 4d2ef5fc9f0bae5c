"""Benchmark: Integrated Gradients per example with the path points batched vs one per forward.

MiniLM, a similarity target (cosine of the mean-pooled sentence embedding to a reference
sentence), ``n_steps`` path points, the first ``n_sentences`` sentences of
``analyses/data/census_sentences.txt``. Contenders, interleaved in every repeat (A, B, C, A,
B, C, ...) so drift on a shared machine hits all of them:

- ``attnprobe``: :func:`attnprobe.attribution.methods.attribute` with
  ``internal_batch_size = n_steps`` (every path point of a text in one forward and backward);
- ``captum_one_step``: Captum's ``LayerIntegratedGradients`` used naively, one path point per
  forward (``internal_batch_size=1``), same layer, baseline, target and ``n_steps``;
- ``captum_default``: the same Captum call with ``internal_batch_size=None`` (Captum's default,
  which also batches all points): shows what the batching itself is worth.

Reported: per-example median time of each contender, the ratios side by side, and the largest
absolute difference between the attributions of the contenders (they compute the same
integral, so it must be at float32 rounding level), plus each run's convergence delta.

Run: ``python analyses/bench_attribution.py [--smoke] [--out DIR]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from harness.benchmarking import Outcome, interleaved, timing_table
from harness.runs import analysis_main

import attnprobe
from attnprobe.attribution.methods import attribute, embedding_layer
from attnprobe.attribution.targets import Target, parse_target
from attnprobe.core.lines import split_lines
from attnprobe.core.optional import require
from attnprobe.inputs.text import encode

DATA = Path(__file__).resolve().parent / "data"


@dataclass
class Config:
    """Sizes of the benchmark (defaults: the full run)."""

    model: str = "minilm"
    corpus: str = "census_sentences.txt"  # under analyses/data/
    n_sentences: int = 8
    reference: str = "A small dog ran across the quiet park."
    n_steps: int = 50
    repeats: int = 5
    warmup: int = 1

    @classmethod
    def smoke(cls) -> Config:
        """Two sentences, 8 steps, one repeat: checks the script end to end."""
        return cls(n_sentences=2, n_steps=8, repeats=1, warmup=0)


def _sentences(cfg: Config) -> list[str]:
    lines = split_lines((DATA / cfg.corpus).read_text(encoding="utf-8"))
    return [line.strip() for line in lines if line.strip()][:cfg.n_sentences]


# ----------------------------------------------------------------------------- contenders
Result = list[tuple[torch.Tensor, float]]  # per text: (scores [token], |delta|)
# a contender returns Outcome({}, Result): the attributions come back for the checks


def _ours(model: Any, tok: Any, texts: list[str], target: Target,
          cfg: Config) -> Callable[[], Outcome]:
    def go() -> Outcome:
        out = attribute(model, tok, texts, target, ["integrated_gradients"],
                        n_steps=cfg.n_steps, internal_batch_size=cfg.n_steps)
        return Outcome({}, [(a.scores, float(a.delta)) for a in out])
    return go


def _captum(model: Any, tok: Any, texts: list[str], target: Target, cfg: Config,
            internal_batch_size: int | None) -> Callable[[], Outcome]:
    """What a Captum user writes: LayerIntegratedGradients on the word embeddings, a pad
    baseline with [CLS]/[SEP] kept, the target as the forward function."""
    captum = require("captum.attr")
    layer = embedding_layer(model)
    specials = torch.tensor(sorted(set(tok.all_special_ids) - {tok.unk_token_id}))

    def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = model(input_ids=input_ids, attention_mask=attention_mask)
        return target(out, {"input_ids": input_ids, "attention_mask": attention_mask})

    def go() -> Outcome:
        results = []
        for text in texts:
            batch = tok([text], return_tensors="pt")
            ids, mask = batch["input_ids"], batch["attention_mask"]
            baseline = torch.where(torch.isin(ids, specials), ids,
                                   torch.full_like(ids, tok.pad_token_id))
            ig = captum.LayerIntegratedGradients(forward, layer)
            scores, delta = ig.attribute(ids, baselines=baseline, additional_forward_args=(mask,),
                                         n_steps=cfg.n_steps,
                                         internal_batch_size=internal_batch_size,
                                         return_convergence_delta=True)
            results.append((scores.sum(-1)[0].detach().double(), float(delta.abs().max())))
        return Outcome({}, results)
    return go


# ----------------------------------------------------------------------------- run
def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Time the contenders side by side and check they agree (nothing is printed)."""
    model, tok = attnprobe.load_model(cfg.model)
    texts = _sentences(cfg)
    target = parse_target(f"similarity:{cfg.reference}", model, tok)
    contenders = {
        "attnprobe": _ours(model, tok, texts, target, cfg),
        "captum_one_step": _captum(model, tok, texts, target, cfg, internal_batch_size=1),
        "captum_default": _captum(model, tok, texts, target, cfg, internal_batch_size=None),
    }
    n_tokens = [int(encode(model, tok, [t])["input_ids"].shape[1]) for t in texts]

    last: dict[str, Result] = {}
    raw_frame = interleaved(contenders, repeats=cfg.repeats, warmup=cfg.warmup, results=last)
    raw_frame.insert(3, "seconds_per_example", raw_frame["seconds"] / len(texts))
    timing = timing_table(raw_frame, value="seconds_per_example", suffix="s_per_example")
    med = timing.set_index("contender")["median_s_per_example"]

    rows, checks = [], []
    for i, (text, n) in enumerate(zip(texts, n_tokens, strict=True)):
        ours, one, default = (last[c][i] for c in contenders)
        tokens = tok.convert_ids_to_tokens(encode(model, tok, [text])["input_ids"][0].tolist())
        for pos, token in enumerate(tokens):
            rows.append({"example_id": str(i), "position": pos, "token": token,
                         "attnprobe": float(ours[0][pos]), "captum_one_step": float(one[0][pos]),
                         "captum_default": float(default[0][pos])})
        checks.append({"example_id": str(i), "tokens": n,
                       "max_abs_diff_vs_one_step": float((ours[0] - one[0]).abs().max()),
                       "max_abs_diff_vs_default": float((ours[0] - default[0]).abs().max()),
                       "max_abs_score": float(ours[0].abs().max()),
                       "delta_attnprobe": ours[1], "delta_one_step": one[1],
                       "delta_default": default[1]})
    checks_frame = pd.DataFrame(checks)
    diff = {"captum_one_step": float(checks_frame["max_abs_diff_vs_one_step"].max()),
            "captum_default": float(checks_frame["max_abs_diff_vs_default"].max())}
    summary = pd.DataFrame([
        {"comparison": f"attnprobe (all {cfg.n_steps} steps per forward) vs {name}",
         "attnprobe_s_per_example": med["attnprobe"], "baseline_s_per_example": med[name],
         "speedup": med[name] / med["attnprobe"], "max_abs_diff": diff[name],
         "max_abs_score": float(checks_frame["max_abs_score"].max())}
        for name in ("captum_one_step", "captum_default")])
    setup = pd.DataFrame([{
        "model": cfg.model, "target": target.spec, "n_steps": cfg.n_steps,
        "sentences": len(texts), "mean_tokens": sum(n_tokens) / len(n_tokens),
        "repeats": cfg.repeats, "max_delta": float(checks_frame[[
            "delta_attnprobe", "delta_one_step", "delta_default"]].to_numpy().max()),
        "foreign_load": float(raw_frame["foreign_load"].mean()),
        "torch_threads": torch.get_num_threads()}])
    return {"summary": summary, "setup": setup, "timing": timing, "checks": checks_frame,
            "timing_raw": raw_frame, "attributions": pd.DataFrame(rows)}


def main(argv: list[str] | None = None) -> None:
    analysis_main("bench_attribution", __doc__, Config, run, argv=argv,
                  show=["summary", "setup", "timing", "checks"])


if __name__ == "__main__":
    main()
