"""Attention vs gradient attributions on tasks whose decisive tokens are known.

Ground truth (:mod:`attnprobe.tasks.keytoken`): ``contains`` (label 1 iff the word ``key``
occurs; decisive = its occurrences) and ``count`` (label 1 iff ``cat`` occurs more often than
``dog``; decisive = every ``cat`` and ``dog``). Three small classifiers
(:mod:`attnprobe.models.classifier`) are trained on each task: Jain & Wallace's BiLSTM +
additive (tanh) attention, their non-contextual "average" encoder + the same attention, and a
2-layer × 2-head Transformer encoder pooled at ``[BOS]``.

For held-out examples, :func:`attnprobe.attribution.comparison.compare` computes the importance
of every token from the attention (the J&W models: their one attention distribution,
``raw@L0``; the Transformer: the ``[BOS]`` row of raw attention, rollout and flow per layer,
and Chefer's attention × gradient) and from attribution methods (Integrated Gradients,
saliency, input × gradient, leave-one-out), all for one target: the log-odds
``logit_1 − logit_0`` (for two classes the logit of J&W's sigmoid output ŷ; the log-odds does
not saturate the way ŷ does on these easily learned tasks). ``[BOS]`` is left out of every
metric, as J&W leave out ``<SOS>``/``<EOS>``. Attribution scores are compared by magnitude.

Tables:

- ``truth``: how well each source (attention view or method) recovers the decisive tokens —
  precision@k (k = number of decisive tokens), share of importance mass on them, AUROC — mean
  ± std over examples that have at least one decisive and one other token (for ``contains``
  that is the positives only: a negative has no decisive token, see the keytoken docstring).
- ``jain_wallace``: Jain & Wallace 2019, Table 2 for these models — per instance Kendall τ
  between the attention and the gradient (input × gradient, J&W's ``XxE[X]``) and between the
  attention and leave-one-out, plus gradient vs leave-one-out; mean ± std over instances and the
  fraction with p ≤ 0.05, over all explained examples; ``jain_wallace_by_class`` adds the same
  per class (``label`` "all", "0", "1").
- ``truth_wide``: the means of ``truth``, one row per source; ``agreement`` /
  ``truth_examples``: the per-example rows behind the summaries; ``training``: accuracies and
  times; ``skipped``: examples a metric could not score (e.g. a constant importance vector has
  no ranking: ``count`` texts made only of ``cat``/``dog`` give the same leave-one-out score
  for every token), with the reason.

Reading the τ: on these tasks nearly all the attention sits on the few decisive tokens and the
remaining weights are tiny and close together, so τ over *all* tokens mostly measures how the
irrelevant tokens are ordered — τ can be modest while every source finds the decisive tokens
(``truth``: AUROC ≈ 1). Both tables are needed to read either.

Differences from J&W: their gradient is taken with the attention *detached* (gradient flows
through the encoder only) and summed over outputs; here it flows through the attention too.
Their reference numbers (Jain & Wallace 2019, real data): BiLSTM τ_g 0.07–0.47 across datasets (SST
0.34 ± 0.21), "average" encoder much higher (SST 0.61 ± 0.20, IMDB 0.67 ± 0.05); gradient and
LOO agree more with each other than either with attention.

Budget: about 1.5 minutes on one CPU thread (2,000 training texts, 400 steps, 100 explained
examples per task and model).

Run: ``python analyses/attribution_truth.py [--smoke] [--out DIR]``; tables, ``truth.png``,
``kendall.png`` and ``provenance.json`` go to ``runs/attribution_truth/<UTC stamp>/``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from harness.runs import analysis_main

from attnprobe.attribution.comparison import Comparison, compare
from attnprobe.attribution.targets import Target
from attnprobe.errors import InputError
from attnprobe.tasks.classification import train_reference_classifiers
from attnprobe.tasks.keytoken import KeyTokenData

JW_REFERENCE = ("J&W (real data): BiLSTM τ_g 0.07–0.47 (SST 0.34±0.21); average encoder "
                "SST 0.61±0.20, IMDB 0.67±0.05")
GRADIENT, LOO = "input_x_gradient", "leave_one_out"
LOG_ODDS = Target("log_odds:1-0", lambda output, inputs: output[:, 1] - output[:, 0])


@dataclass
class Config:
    tasks: tuple[str, ...] = ("contains", "count")
    models: tuple[str, ...] = ("bilstm-classifier", "average-classifier",
                               "transformer-classifier")
    n_train: int = 2000
    n_held_out: int = 500
    n_explain: int = 100  # held-out examples explained per (task, model)
    min_len: int = 4
    max_len: int = 12
    vocab_words: int = 16
    steps: int = 400
    batch_size: int = 32
    lr: float = 1e-2
    methods: tuple[str, ...] = ("integrated_gradients", "saliency", GRADIENT, LOO)
    # the J&W models have one single-query attention layer: only its raw weights apply
    transformer_views: tuple[str, ...] = ("raw", "rollout", "flow", "attn_x_grad")
    ig_steps: int = 50
    num_threads: int = 1
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        return cls(n_train=64, n_held_out=16, n_explain=4, steps=3, ig_steps=4)


def views_for(model_name: str, cfg: Config) -> tuple[str, ...]:
    return cfg.transformer_views if model_name.startswith("transformer") else ("raw",)


def explain(cfg: Config, model: torch.nn.Module, tok, data: KeyTokenData, task: str,
            name: str) -> tuple[list[pd.DataFrame], list[pd.DataFrame], list[dict]]:
    """Compare every example on its own, so one unscorable example is skipped, not fatal."""
    agreement, truth, skipped = [], [], []
    for i, (text, label, mask) in enumerate(zip(data.texts, data.labels.tolist(),
                                                 data.decisive, strict=True)):
        scorable = bool(mask.any()) and not bool(mask.all())
        try:
            result = compare(model, tok, [text], LOG_ODDS, methods=cfg.methods,
                             views=views_for(name, cfg), query="cls",
                             truth=[mask] if scorable else None, n_steps=cfg.ig_steps)
        except InputError as err:
            skipped.append({"task": task, "model": name, "example_id": str(i), "label": label,
                            "reason": str(err)})
            continue
        tag = {"task": task, "model": name, "label": label}
        agreement.append(result.table.assign(example_id=str(i), **tag))
        if scorable:
            truth.append(result.truth_table.assign(example_id=str(i), **tag))
    return agreement, truth, skipped


def jw_rows(table: pd.DataFrame, task: str, name: str, label: str) -> list[dict]:
    """Kendall τ rows of the J&W table from per-example agreement rows."""
    summary = Comparison(table, pd.DataFrame()).summary()
    tau = summary[summary["metric"] == "kendall_tau"]
    rows = []
    for r in tau.itertuples():
        if r.source_kind == "attention" and r.method in (GRADIENT, LOO):
            versus = "gradient" if r.method == GRADIENT else "leave_one_out"
            comparison = f"attention vs {versus}"
        elif r.source_kind == "attribution" and {r.source, r.method} == {GRADIENT, LOO}:
            comparison = "gradient vs leave_one_out"
        else:
            continue
        rows.append({"task": task, "model": name, "label": label, "comparison": comparison,
                     "attention": r.source if r.source_kind == "attention" else "",
                     "tau_mean": r.mean, "tau_std": r.std,
                     "frac_significant": r.frac_significant, "n": r.n})
    return rows


def wide(truth: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, model, source): the mean of each truth metric."""
    if truth.empty:
        return truth
    table = truth.pivot_table(index=["task", "model", "source_kind", "source"],
                              columns="metric", values="mean", sort=False)
    return table.reset_index().rename_axis(columns=None)


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Train every (task, model), explain held-out examples, score against the truth."""
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.num_threads)
    try:
        training, agreement, truth, skipped, jw, truth_summary = [], [], [], [], [], []
        for trained in train_reference_classifiers(
                cfg.tasks, cfg.models, n_train=cfg.n_train, n_held_out=cfg.n_held_out,
                steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed,
                min_len=cfg.min_len, max_len=cfg.max_len, vocab_words=cfg.vocab_words):
            task, name, model, tok, held = (trained.task, trained.name, trained.model,
                                            trained.tokenizer, trained.held_out)
            shown = held.select(range(min(cfg.n_explain, len(held))))
            training.append({"task": task, "model": name, **trained.result})
            start = time.perf_counter()
            rows, truth_rows, skip = explain(cfg, model, tok, shown, task, name)
            training[-1]["explain_seconds"] = time.perf_counter() - start
            agreement += rows
            truth += truth_rows
            skipped += skip
            if rows:
                table = pd.concat(rows, ignore_index=True)
                jw += jw_rows(table, task, name, "all")
                for label in (0, 1):
                    part = table[table["label"] == label]
                    if not part.empty:
                        jw += jw_rows(part, task, name, str(label))
            if truth_rows:
                frame = pd.concat(truth_rows, ignore_index=True)
                summary = Comparison(pd.DataFrame(), frame).truth_summary()
                truth_summary.append(summary.assign(task=task, model=name))
    finally:
        torch.set_num_threads(threads)
    first = ["task", "model"]

    def ordered(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[first + [c for c in frame.columns if c not in first]]

    jw_frame = pd.DataFrame(jw)
    if not jw_frame.empty:
        jw_frame["reference"] = [
            JW_REFERENCE if r.comparison == "attention vs gradient" and r.attention == "raw@L0"
            and r.label == "all" and not r.model.startswith("transformer") else ""
            for r in jw_frame.itertuples()]
    truth_frame = ordered(pd.concat(truth_summary, ignore_index=True)) if truth_summary \
        else pd.DataFrame()
    return {
        "training": pd.DataFrame(training),
        "truth": truth_frame,
        "truth_wide": wide(truth_frame),
        "jain_wallace": jw_frame[jw_frame["label"] == "all"].drop(columns="label")
        if not jw_frame.empty else jw_frame,
        "jain_wallace_by_class": jw_frame,
        "agreement": ordered(pd.concat(agreement, ignore_index=True)) if agreement
        else pd.DataFrame(),
        "truth_examples": ordered(pd.concat(truth, ignore_index=True)) if truth
        else pd.DataFrame(),
        "skipped": pd.DataFrame(skipped, columns=["task", "model", "example_id", "label",
                                                  "reason"]),
    }


def plot(tables: dict[str, pd.DataFrame], path: Path) -> list[Path]:
    """``truth.png``: AUROC and mass on the decisive tokens per source; ``kendall.png``: the
    J&W τ (attention vs gradient / LOO, all examples) per model and task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    truth = tables["truth"]
    if not truth.empty:
        metrics = ["auroc", "mass_on_truth"]
        pairs = truth[["task", "model"]].drop_duplicates().values.tolist()
        fig, axes = plt.subplots(len(pairs), len(metrics), squeeze=False,
                                 figsize=(6 * len(metrics), 2.2 + 0.25 * len(truth) / 3))
        for row, (task, model) in enumerate(pairs):
            sub = truth[(truth["task"] == task) & (truth["model"] == model)]
            for col, metric in enumerate(metrics):
                ax = axes[row][col]
                part = sub[sub["metric"] == metric]
                colors = ["tab:blue" if k == "attention" else "tab:orange"
                          for k in part["source_kind"]]
                ax.barh(part["source"], part["mean"], xerr=part["std"].fillna(0),
                        color=colors)
                ax.set_xlim(0, 1.05)
                ax.set_title(f"{task} / {model}: {metric}", fontsize=9)
                ax.tick_params(labelsize=7)
        fig.tight_layout()
        out = path / "truth.png"
        fig.savefig(out, dpi=110)
        plt.close(fig)
        written.append(out)
    jw = tables["jain_wallace"]  # all examples (per class: jain_wallace_by_class)
    if not jw.empty:
        tasks = list(dict.fromkeys(jw["task"]))
        fig, axes = plt.subplots(len(tasks), 1, squeeze=False, figsize=(11, 3.6 * len(tasks)))
        comparisons = ["attention vs gradient", "attention vs leave_one_out",
                       "gradient vs leave_one_out"]
        width = 0.27
        for ax, task in zip(axes[:, 0], tasks, strict=True):
            sub = jw[jw["task"] == task]
            groups = list(dict.fromkeys(
                (r.model, r.attention) for r in sub.itertuples() if r.attention))
            for k, comparison in enumerate(comparisons):
                xs, ys, errs = [], [], []
                for g, (model, attention) in enumerate(groups):
                    match = sub[(sub["model"] == model) & (sub["comparison"] == comparison)]
                    if comparison.startswith("attention"):
                        match = match[match["attention"] == attention]
                    if not match.empty:
                        xs.append(g + (k - 1) * width)
                        ys.append(float(match["tau_mean"].iloc[0]))
                        errs.append(float(match["tau_std"].fillna(0).iloc[0]))
                ax.bar(xs, ys, width, yerr=errs, label=comparison, capsize=2)
            ax.set_xticks(range(len(groups)),
                          [f"{m.replace('-classifier', '')}\n{a}" for m, a in groups],
                          fontsize=7)
            ax.axhline(0, color="grey", linewidth=0.5)
            ax.set_ylabel("Kendall τ (mean ± std)")
            ax.set_title(f"{task}: Jain & Wallace agreement over examples", fontsize=9)
            ax.legend(fontsize=7)
        fig.tight_layout()
        out = path / "kendall.png"
        fig.savefig(out, dpi=120)
        plt.close(fig)
        written.append(out)
    return written


def main(argv: list[str] | None = None) -> None:
    analysis_main("attribution_truth", __doc__, Config, run, plot, argv,
                  show=["training", "truth_wide", "jain_wallace", "skipped"])


if __name__ == "__main__":
    main()
