"""Benchmark: what :func:`attnprobe.faithfulness.evaluate` costs beyond its parts.

Ten sources (the five default attribution methods — Integrated Gradients, saliency,
input × gradient, GradientSHAP, leave-one-out — and the views raw, rollout, attention ×
gradient, value zeroing and ALTI) at the five default removal levels, explaining MiniLM's
similarity of each of 200 sentences of ``analyses/data/census_sentences.txt`` to a fixed
other one. Two contenders, side by side in one run (interleaved, medians of ``repeats``
timed rounds after ``warmup`` untimed ones):

- ``evaluate``: one ``evaluate(model, tok, texts, target, methods=..., views=...)`` call;
- the baseline, its parts done once each with nothing shared: ``sources``, each text's
  explanations computed on their own (:func:`attnprobe.faithfulness.sources.explain_text`,
  the job ``evaluate`` builds), plus ``pool forward``, one plain batched forward (no
  gradient, no target read) over every *distinct* perturbed input the tests need, built
  beforehand (untimed) with :func:`attnprobe.faithfulness.plan.plan_text` into one
  :class:`~attnprobe.faithfulness.plan.InputPool`, sorted by length, right-padded, about
  :data:`~attnprobe.faithfulness.evaluate.PASS_TOKENS` tokens per forward.

Target: ``evaluate / (sources + pool forward) ≤ 1.3``. The run also checks that the baseline's
pool gives ``evaluate``'s table: the pool's outputs, read by each text's target, turned into
rows by :func:`~attnprobe.faithfulness.plan.score_text`, equal ``evaluate``'s values.

``--sentences N``, ``--repeats R`` and ``--warmup W`` shrink the run (at the full size each
contender takes about 7 minutes a round on 2 CPU cores, about 2 s per sentence).

Run: ``python analyses/bench_faithfulness.py [--smoke] [--sentences N] [--repeats R]
[--warmup W] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from faithfulness_study import census_sentences, source_job
from finetune_diff import Config as FinetuneConfig
from finetune_diff import load as load_encoder
from harness.benchmarking import interleaved, ratios, timing_table, with_result
from harness.runs import print_tables, provenance, run_dir, torch_threads, write_run

from attnprobe.attribution.views import build_views
from attnprobe.core.tokens import special_ids
from attnprobe.faithfulness import evaluate
from attnprobe.faithfulness.evaluate import PASS_TOKENS
from attnprobe.faithfulness.metrics import DEFAULT_LEVELS
from attnprobe.faithfulness.options import DEFAULT_METHODS
from attnprobe.faithfulness.plan import Design, InputPool, TextPlan, plan_text, score_text
from attnprobe.faithfulness.removal import pad_batch, removal_for
from attnprobe.faithfulness.sources import SourceJob, explain_text, source_kind
from attnprobe.inputs.text import model_inputs

VIEWS = ("raw", "rollout", "attn_x_grad", "value_zeroing", "alti")
TARGET_RATIO = 1.3


@dataclass
class Config:
    model: str = "minilm"  # "tiny-bert": a random 2 x 2 BERT with MiniLM's tokenizer
    n_sentences: int = 200
    methods: tuple[str, ...] = DEFAULT_METHODS
    views: tuple[str, ...] = VIEWS
    levels: tuple[float, ...] = DEFAULT_LEVELS
    curve_steps: int = 10
    n_steps: int = 20  # Integrated Gradients path points
    repeats: int = 3
    warmup: int = 1
    num_threads: int = 0  # 0: torch's default
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        return cls(model="tiny-bert", n_sentences=2, methods=("saliency", "leave_one_out"),
                   views=("raw", "alti"), n_steps=4, curve_steps=4, repeats=1, warmup=0)


@dataclass
class Bench:
    """What both contenders share."""

    model: Any
    tokenizer: Any
    texts: list[str]
    target: str
    job: SourceJob
    cfg: Config


def _given(bench: Bench, text: str) -> dict[str, torch.Tensor]:
    encoded = bench.tokenizer(text, return_tensors="pt")
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


def run_evaluate(bench: Bench) -> pd.DataFrame:
    cfg = bench.cfg
    return evaluate(bench.model, bench.tokenizer, bench.texts, bench.target,
                    methods=cfg.methods, views=bench.job.views, levels=cfg.levels,
                    curve_steps=cfg.curve_steps, n_steps=cfg.n_steps, seed=cfg.seed).table


def run_sources(bench: Bench) -> list[tuple[list, Any]]:
    """Every text's explanations, one text at a time (the sources' own computation)."""
    return [explain_text(bench.job, str(i), _given(bench, text))
            for i, text in enumerate(bench.texts)]


def build_pool(bench: Bench, explained: list[tuple[list, Any]]
               ) -> tuple[InputPool, list[TextPlan], list[Any]]:
    """Every distinct perturbed input of every text and source (untimed)."""
    cfg = bench.cfg
    pool, plans, targets = InputPool(), [], []
    shared: dict[str, int] = {}  # texts with the same fixed target share their inputs
    special = frozenset(special_ids(bench.tokenizer))
    design = Design(removal_for(bench.tokenizer), tuple(cfg.levels), cfg.curve_steps)
    for i, (text, (found, fixed)) in enumerate(zip(bench.texts, explained, strict=True)):
        ids = _given(bench, text)["input_ids"][0]
        keep = np.array([int(t) in special for t in ids.tolist()], dtype=bool)
        if fixed.spec not in shared:
            shared[fixed.spec] = len(targets)
            targets.append(fixed)
        sources = [(a.method, source_kind(bench.job.method_names, a.method), a.scores.numpy())
                   for a in found]
        plans.append(plan_text(str(i), ids, keep, sources, design, pool, shared[fixed.spec],
                               target_spec=fixed.spec, seed=cfg.seed + i))
    return pool, plans, targets


def pool_forward(bench: Bench, pool: InputPool, targets: list[Any] | None = None
                 ) -> np.ndarray | None:
    """One plain batched forward over the pool: inputs sorted by length, longest first (so a
    forward holds at most about ``PASS_TOKENS`` tokens, as in ``evaluate``), right-padded.
    With ``targets`` (untimed check), each row read by its text's target, ``[len(pool)]``."""
    pad = bench.tokenizer.pad_token_id or 0
    order = sorted(range(len(pool)), key=lambda i: -pool.items[i].input_ids.numel())
    out = np.full(len(pool), np.nan) if targets is not None else None
    start = 0
    with torch.no_grad():
        while start < len(order):
            width = pool.items[order[start]].input_ids.numel()
            chunk = order[start:start + max(1, PASS_TOKENS // max(width, 1))]
            ids, mask = pad_batch([pool.items[i] for i in chunk], pad)
            inputs = model_inputs(bench.model, {"input_ids": ids, "attention_mask": mask})
            output = bench.model(**inputs)
            if out is not None:
                for row, i in enumerate(chunk):
                    value = targets[pool.targets[i]](output, inputs)[row]
                    out[i] = float(value)
            start += len(chunk)
    return out


def checks(bench: Bench, table: pd.DataFrame, pool: InputPool, plans: list[TextPlan],
           targets: list[Any]) -> pd.DataFrame:
    """The baseline's pool reproduces ``evaluate``'s table (float32 forwards of different
    batch shapes: rounding only)."""
    outputs = pool.outputs_with_undefined(pool_forward(bench, pool, targets))
    removal = removal_for(bench.tokenizer).label
    rows = [r for plan in plans for r in score_text(plan, outputs, bench.cfg.levels, removal)[0]]
    mine = pd.DataFrame(rows, columns=list(table.columns))
    keys = ["example_id", "source", "metric", "level"]
    merged = table.merge(mine, on=keys, suffixes=("", "_pool"), how="outer", indicator=True)
    both = merged[merged["_merge"] == "both"]
    return pd.DataFrame([
        {"check": "texts", "value": float(len(bench.texts))},
        {"check": "sources (plus the random baseline)",
         "value": float(table["source"].nunique() - 1)},
        {"check": "distinct perturbed inputs in the pool", "value": float(len(pool))},
        {"check": "tokens in the pool", "value": float(sum(i.input_ids.numel()
                                                           for i in pool.items))},
        {"check": "table rows only one side has", "value": float((merged["_merge"]
                                                                  != "both").sum())},
        {"check": "max |evaluate - baseline pool| table value",
         "value": float((both["value"] - both["value_pool"]).abs().max())},
    ])


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    with torch_threads(cfg.num_threads):
        threads = torch.get_num_threads()
        model, tok = load_encoder(FinetuneConfig(model=cfg.model, seed=cfg.seed))
        anchor, *texts = census_sentences(cfg.n_sentences + 1)
        target = f"similarity:{anchor}"
        views = tuple(build_views(list(cfg.views), model=model))
        job = source_job(model, tok, target, cfg.methods, views, cfg.n_steps)
        bench = Bench(model, tok, texts, target, job, cfg)
        pool, plans, targets = build_pool(bench, run_sources(bench))  # untimed
        names = {"evaluate": "evaluate", "sources": "baseline: sources",
                 "forward": "baseline: pool forward"}
        results: dict[str, Any] = {}
        raw = interleaved({
            names["evaluate"]: with_result(lambda: run_evaluate(bench)),
            names["sources"]: with_result(lambda: run_sources(bench)),
            names["forward"]: with_result(lambda: pool_forward(bench, pool)),
        }, repeats=cfg.repeats, warmup=cfg.warmup, results=results)
        found = checks(bench, results[names["evaluate"]], pool, plans, targets)
    timing = timing_table(raw)
    med = timing.set_index("contender")["median_s"]
    baseline = float(med[names["sources"]] + med[names["forward"]])
    rounds = raw.pivot_table(index="repeat", columns="contender", values="seconds")
    paired = rounds[names["evaluate"]] / (rounds[names["sources"]] + rounds[names["forward"]])
    summary = pd.DataFrame([{
        "benchmark": f"{len(cfg.methods) + len(views)} sources x {len(cfg.levels)} levels, "
                     f"{len(texts)} {cfg.model} sentences (similarity)",
        "evaluate_s": float(med[names["evaluate"]]), "sources_s": float(med[names["sources"]]),
        "pool_forward_s": float(med[names["forward"]]), "baseline_s": baseline,
        "ratio (evaluate / baseline)": float(med[names["evaluate"]]) / baseline,
        "median_paired_ratio": float(paired.median()), "target": TARGET_RATIO,
        "sources / evaluate": float(med[names["sources"]] / med[names["evaluate"]]),
        "foreign_load": float(raw["foreign_load"].mean()),
    }])
    extra = ratios(raw, names["evaluate"], names["sources"])
    found = pd.concat([found, pd.DataFrame([
        {"check": "evaluate / sources alone (ratio of medians)",
         "value": float(extra["ratio_of_medians"])},
        {"check": "torch threads", "value": float(cfg.num_threads or threads)}])],
        ignore_index=True)
    return {"summary": summary, "timing": timing, "timing_raw": raw, "checks": found}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="bench_faithfulness.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, quick end-to-end check")
    parser.add_argument("--sentences", type=int, help="sentences explained (default 200)")
    parser.add_argument("--repeats", type=int, help="timed rounds (default 3)")
    parser.add_argument("--warmup", type=int, help="untimed rounds first (default 1)")
    parser.add_argument("--out", type=Path, help="output folder (default "
                                                 "runs/bench_faithfulness/<stamp>/)")
    args = parser.parse_args(argv)
    cfg = Config.smoke() if args.smoke else Config()
    sizes = {"n_sentences": args.sentences, "repeats": args.repeats, "warmup": args.warmup}
    cfg = replace(cfg, **{k: v for k, v in sizes.items() if v is not None})
    out = run_dir("bench_faithfulness", args.out)
    start = time.perf_counter()
    tables = run(cfg)
    wall = time.perf_counter() - start
    print_tables(tables, ["summary", "timing", "checks"])
    write_run(out, tables, provenance("analyses/bench_faithfulness.py", cfg, wall))
    print(f"\nwall time {wall:.1f} s; results written to {out}/")
    return out


if __name__ == "__main__":
    main()
