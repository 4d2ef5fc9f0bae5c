"""Does the cross attention of a trained seq2seq find the true alignment? Tasks with known π.

Methods §12: on synthetic tasks where output position ``t`` is produced from input position
``π(t)`` (``copy`` π(t) = t, ``reverse`` π(t) = n − 1 − t, ``permutation`` one fixed random π per
length), a well-trained one-layer attention seq2seq is expected to reach ≈100% alignment
accuracy on copy and reverse — "the common folklore result, not a published table".
``permutation`` over lengths 5–15 means eleven unrelated permutations, one per length, that the
model must tell apart by the source length alone; ``permutation@10`` trains and tests on
length 10 only (one fixed, non-monotone π), which a small model can learn in the budget.

For each task and attention variant (:class:`attnprobe.models.seq2seq.Seq2Seq` with Bahdanau
additive and Luong general attention, GRU encoder and decoder) we train on source lengths
``[min_len, max_len]``, then on held-out examples:

- greedy-decode and score the task (sequence and token accuracy);
- capture the cross attention of a teacher-forced forward with :func:`attnprobe.capture` and
  score each example's ``[target, source]`` map against π with
  :mod:`attnprobe.tasks.metrics`: alignment accuracy (argmax = π(t)), gold mass
  (``mean_t α_{t,π(t)}``) and AER of the argmax links against the sure links ``t -> π(t)``;
  the table holds means over examples.

Row convention (no shift): the decoder input is ``[BOS] + target``, so capture's map has
``n + 1`` query rows and row ``t`` is the step that reads ``y_{t−1}`` (``[BOS]`` at ``t = 0``)
and *predicts label t*. In both variants the weights of row ``t`` build the context used for
that prediction (Bahdanau: ``c_t = attn(s_{t−1}, H)`` feeds the step; Luong: ``c_t =
attn(s_t, H)`` after the GRU step), so row ``t`` is scored against π(t); the last row, which
predicts ``[EOS]``, has no gold link and is dropped. With one argmax link per row and every
gold link sure, AER = 1 − alignment accuracy exactly; it is reported for completeness.

Diagnostics beside the headline: ``row_shift_accuracy`` scores the other row convention
(row ``t + 1``, whose query *token* is label ``t``, against π(t), the "shift by one" of methods
§12), and ``argmax_at_gold_plus_1`` / ``_minus_1`` the fraction of rows whose argmax sits one
source position right / left of π(t). They matter because the reference encoder is a
*unidirectional* GRU (Bahdanau et al. used a bidirectional one): the annotation ``h_j`` summarises
``x_0 .. x_j``, so ``x_{π(t)}`` is also readable from ``h_{π(t)+1}``, and a model can solve the
task while its argmax sits next to the gold position. On ``reverse`` the two diagnostics
coincide (π(t) + 1 = π(t − 1)), so they cannot tell a row lag from a source offset there.

Budget: about 5 minutes on one CPU thread (``num_threads`` = 1: 2 threads were no faster on
these small GRUs on a shared 2-core machine; see ``seq2seq_bottleneck.py``).

Run: ``python analyses/alignment.py [--smoke] [--out DIR]``; tables, one heatmap per task,
``alignment.png`` and ``provenance.json`` go to ``runs/alignment/<UTC stamp>/``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from harness.runs import analysis_main

import attnprobe
from attnprobe.models.seq2seq import Seq2Seq, Seq2SeqConfig
from attnprobe.tasks.metrics import alignment_accuracy, attention_aer, gold_mass
from attnprobe.tasks.synthetic import TaskBatch, make_batch
from attnprobe.tasks.training import decode_scores, train_seq2seq

FOLKLORE = "≈100% alignment accuracy on copy/reverse (methods §12 folklore, no published table)"


@dataclass
class Config:
    # "name" trains on [min_len, max_len]; "name@L" on length L only
    tasks: tuple[str, ...] = ("copy", "reverse", "permutation", "permutation@10")
    models: tuple[str, ...] = ("bahdanau", "luong-general")
    vocab_size: int = 32
    d_embed: int = 32
    d_hidden: int = 64
    steps: int = 1200
    batch_size: int = 64
    lr: float = 5e-3
    clip: float = 1.0
    min_len: int = 5
    max_len: int = 15
    eval_examples: int = 200
    log_every: int = 50
    num_threads: int = 1
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        return cls(tasks=("copy", "reverse"), models=("bahdanau",), d_embed=8, d_hidden=8,
                   steps=3, batch_size=4, min_len=3, max_len=6, eval_examples=4, log_every=1)


def task_spec(entry: str, cfg: Config) -> tuple[str, int, int]:
    """``"reverse"`` -> ``("reverse", min_len, max_len)``; ``"permutation@10"`` ->
    ``("permutation", 10, 10)``."""
    name, _, length = entry.partition("@")
    return (name, int(length), int(length)) if length else (name, cfg.min_len, cfg.max_len)


def train(cfg: Config, entry: str, attention: str) -> tuple[Seq2Seq, list[dict]]:
    """Train one model on fresh batches of one task; returns it and its training curve."""
    task, lo, hi = task_spec(entry, cfg)
    torch.manual_seed(cfg.seed)
    model = Seq2Seq(Seq2SeqConfig(vocab_size=cfg.vocab_size, d_embed=cfg.d_embed,
                                  d_hidden=cfg.d_hidden, attention=attention))

    def batch_at(step: int) -> TaskBatch:
        return make_batch(task, cfg.batch_size, min_len=lo, max_len=hi,
                          vocab_size=cfg.vocab_size, seed=cfg.seed * 1_000_003 + step)

    curve = train_seq2seq(model, batch_at, steps=cfg.steps, lr=cfg.lr, clip=cfg.clip,
                          log_every=cfg.log_every)
    return model, [{**point, "task": entry, "model": attention} for point in curve]


def evaluate(cfg: Config, model: Seq2Seq, entry: str, attention: str
             ) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Task and alignment scores on held-out examples; also one example's map and its π."""
    task, lo, hi = task_spec(entry, cfg)
    batch = make_batch(task, cfg.eval_examples, min_len=lo, max_len=hi,
                       vocab_size=cfg.vocab_size, seed=10_000_000 + cfg.seed)
    scores = decode_scores(model, batch, max_new_tokens=hi + 5)
    with torch.no_grad(), attnprobe.capture(model) as cap:
        model(**batch.model_inputs())
    acc, mass, aer, shifted, plus, minus = [], [], [], [], [], []
    for amap, pi in zip(cap.maps, batch.alignment, strict=True):
        pattern = amap.pattern[0, 0]  # [n + 1 (BOS + target), n]
        n = len(pi)
        if tuple(pattern.shape) != (n + 1, n):
            raise RuntimeError(f"expected a [{n + 1}, {n}] map, got {tuple(pattern.shape)}")
        rows = pattern[:n]  # row t predicts label t (the EOS row is dropped)
        acc.append(alignment_accuracy(rows, pi))
        mass.append(gold_mass(rows, pi))
        aer.append(attention_aer(rows, pi))
        shifted.append(alignment_accuracy(pattern[1:], pi))  # the other row convention
        plus.append(alignment_accuracy(rows, pi + 1))  # one source position right of gold
        minus.append(alignment_accuracy(rows, pi - 1))  # one source position left of gold
    row = {"task": entry, "model": attention,
           "sequence_accuracy": scores["sequence_accuracy"],
           "token_accuracy": scores["token_accuracy"],
           "alignment_accuracy": statistics.fmean(acc), "gold_mass": statistics.fmean(mass),
           "aer": statistics.fmean(aer), "row_shift_accuracy": statistics.fmean(shifted),
           "argmax_at_gold_plus_1": statistics.fmean(plus),
           "argmax_at_gold_minus_1": statistics.fmean(minus), "examples": len(acc)}
    longest = max(range(len(batch.alignment)), key=lambda i: len(batch.alignment[i]))
    return row, cap.maps[longest].pattern[0, 0], batch.alignment[longest]


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Train and score every (task, model) pair; tidy tables (nothing is printed).

    ``examples`` holds one held-out example's full map per pair (the longest source), long
    format, for the heatmaps.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.num_threads)
    try:
        curves, results, cells = [], [], []
        for task in cfg.tasks:
            for attention in cfg.models:
                start = time.perf_counter()
                model, curve = train(cfg, task, attention)
                seconds = time.perf_counter() - start
                curves += curve
                row, pattern, pi = evaluate(cfg, model, task, attention)
                results.append({**row, "train_s": seconds})
                for t in range(pattern.shape[0]):
                    for j in range(pattern.shape[1]):
                        cells.append({"task": task, "model": attention, "row": t, "source": j,
                                      "weight": float(pattern[t, j]),
                                      "gold": t < len(pi) and int(pi[t]) == j})
    finally:
        torch.set_num_threads(threads)
    results_df = pd.DataFrame(results)
    summary = results_df[["task", "model", "alignment_accuracy", "gold_mass",
                          "sequence_accuracy"]].copy()
    summary["expected"] = [FOLKLORE if task in ("copy", "reverse") else ""
                           for task in summary["task"]]
    return {"training": pd.DataFrame(curves), "results": results_df, "summary": summary,
            "examples": pd.DataFrame(cells)}


def plot(tables: dict[str, pd.DataFrame], path: Path) -> list[Path]:
    """One heatmap per task (one panel per model, gold links boxed) and a bar chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    cells = tables["examples"]
    for task, by_task in cells.groupby("task", sort=False):
        models = list(by_task["model"].unique())
        fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 4), squeeze=False)
        for ax, model in zip(axes[0], models, strict=True):
            sub = by_task[by_task["model"] == model]
            grid = sub.pivot(index="row", columns="source", values="weight").to_numpy()
            ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, aspect="auto")
            gold = sub[sub["gold"]]
            ax.scatter(gold["source"], gold["row"], s=30, facecolors="none", edgecolors="red",
                       linewidths=0.8, label="gold π(t)")
            ax.set_title(f"{task}: {model}")
            ax.set_xlabel("source position")
            ax.set_ylabel("decoder step t (predicts label t; last = EOS)")
            ax.legend(loc="lower left", fontsize=7)
        fig.tight_layout()
        out = path / f"heatmap_{task.replace('@', '_len')}.png"
        fig.savefig(out, dpi=110)
        plt.close(fig)
        written.append(out)

    results = tables["results"]
    metrics = ["alignment_accuracy", "gold_mass", "sequence_accuracy"]
    labels = [f"{r.task}\n{r.model}" for r in results.itertuples()]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(results)), 4))
    width = 0.8 / len(metrics)
    for k, metric in enumerate(metrics):
        ax.bar([i + (k - 1) * width for i in range(len(results))], results[metric], width,
               label=metric)
    ax.set_xticks(range(len(results)), labels, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.axhline(1.0, color="grey", linewidth=0.5)
    ax.legend(fontsize=8)
    ax.set_title("Cross attention vs true alignment (held-out examples)")
    fig.tight_layout()
    out = path / "alignment.png"
    fig.savefig(out, dpi=120)
    plt.close(fig)
    written.append(out)
    return written


def main(argv: list[str] | None = None) -> None:
    analysis_main("alignment", __doc__, Config, run, plot, argv, show=["results", "summary"])


if __name__ == "__main__":
    main()
