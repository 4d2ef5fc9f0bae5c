"""Perturbation studies: how much does the output care when the attention is changed?

What the papers claim:

- Jain & Wallace (§5.2–5.3): attention can be perturbed heavily without changing the output —
  randomly permuting a BiLSTM classifier's attention changes many predictions very little,
  even where the attention is peaked, and for most examples an adversary finds a very
  different attention (JSD near ln 2 ≈ 0.69) that keeps the output within TVD ε = 0.01.
- Serrano & Smith (§6): erasing the highest-weighted items one by one often needs a large
  fraction of them before the decision flips; a gradient-based ranking flips it sooner.
- Kovaleva et al. (§2.3) / Wiegreffe & Pinter (§7): many heads can be replaced by uniform
  attention (``1/L``) at no cost — disabling a single head even helps — and a uniform
  attention is a strong baseline on some tasks.
- Michel et al. (§4): a large share of the heads — about 20% (WMT) and 40% (BERT/MNLI),
  pruned in order of increasing importance ``I_h = E_x |∂L/∂ξ_h|`` — can go before the
  metric drops noticeably.

Models: the three reference classifiers of ``attribution_truth.py`` (Jain & Wallace's BiLSTM +
additive attention, their non-contextual "average" encoder + the same attention, a 2-layer ×
2-head Transformer pooled at ``[BOS]``), trained with the same recipe on the key-token tasks
``contains`` and ``count`` (:mod:`attnprobe.tasks.keytoken`); and MiniLM
(all-MiniLM-L6-v2, 6 × 12 heads) with an embedding readout (attention-masked mean of the last
hidden state) on the bundled census sentences.

Tables (one per experiment, each with a summary):

1. ``permutation`` / ``permutation_summary`` (J&W §5.2): per held-out example, 100
   permutations of the attention in one batched forward (``permute`` draws one permutation per
   batch row; the J&W models: their single attention, over the words only — ``[BOS]`` has
   weight 0, as J&W keep SOS/EOS fixed; Transformer / MiniLM: every head and query row of one
   layer, the first and the last in turn, column ``layer``). ``median_change`` is the median
   over the permutations of the TVD of the class probabilities (MiniLM: the cosine distance of
   the embedding). ``max_attention`` is the largest weight of each row that reaches the output,
   averaged over those rows and the permuted heads (J&W: their one row; the Transformer's last
   layer: the ``[BOS]`` row it pools; MiniLM and first layers: every real query row).
   ``share_small``: examples whose median change is below 0.01; ``..._peaked``: the same
   among examples with ``max_attention >= 0.5``.
2. ``uniform`` (Kovaleva / W&P, no retraining): each head (``unit = head``), then each layer
   (``unit = layer``, all its heads), replaced by uniform weights over the valid keys;
   classifiers: mean TVD, decision flips and held-out accuracy change; MiniLM: mean cosine
   similarity of the embedding to the unperturbed one.
3. ``erasure`` / ``erasure_summary`` (S&S §6.2): keys of the attention are erased one more per
   step (``erase`` with a key mask, renormalising over what is left) in order of attention
   weight (J&W: their row; Transformer: the head-mean ``[BOS]`` row of the last layer, erased
   in every head and row of that layer), of Integrated Gradients importance (the log-odds of
   the predicted class, signed: the tokens that support the prediction most go first) and in a
   random order, until the decision flips; at most ``n − 1`` of the ``n`` keys are erased.
   ``frac_erased`` is the fraction of keys erased at the flip, ``mass_erased`` the attention
   mass they held; ``share_never_flip`` the share of examples that still do not flip.
4. ``adversarial`` / ``adversarial_summary`` (J&W §5.3): for the BiLSTM, K = 5 adversaries,
   Adam (lr 0.01), the largest JSD from the model's attention among adversaries that keep the
   output within TVD ε = 0.01 (NaN where none does).
5. ``importance`` / ``pruning`` / ``pruning_summary`` (Michel §4): head importance on one set
   of texts (MiniLM: :func:`~attnprobe.perturb.similarity_loss` to ``reference_sentence``;
   classifiers: cross-entropy on training examples), then the pruning curve on other texts
   (MiniLM: mean cosine similarity to the unpruned embeddings; classifiers: held-out accuracy),
   pruning heads in order of increasing importance and in ``n_random_orders`` random orders.
   ``share_prunable``: the largest share of heads pruned while every point so far keeps at
   least 90% of the unpruned metric.

``training`` holds the classifiers' accuracies, ``skipped`` examples an intervention could not
act on (e.g. a permutation that moves nothing because one key holds all the weight).

What the tables show (reference run, seed 0, every classifier at 100% held-out accuracy):
the seeds' claims hold only where the model does not need the attention.

- Permutation: where the decision rests on the attended token, permuting flips it. On
  ``contains`` the J&W BiLSTM's positives (the max weight sits on ``key``) change by a median
  TVD ≈ 1 (0 of the 45 examples with max weight ≥ 0.5 stay below 0.01; Spearman ρ of max weight
  vs change 0.87), and so does the "average" encoder's; only its negatives (flat attention)
  do not move. On ``count`` the BiLSTM carries the counts in its states: the median change is
  1e-4 and 75% of examples stay below 0.01 (59% of the peaked ones). The Transformer does not
  care about its last layer (median TVD 3e-7 / 5e-7; every example < 0.01 on ``contains``), but
  permuting its first layer flips 34% of all ``contains`` permutations (the positives').
  MiniLM: median cosine distance 0.09 (layer 0) and 0.22 (layer 5), never below 0.01.
- Uniform: replacing the J&W attention by uniform weights costs 46–50 accuracy points on
  ``contains`` (27 for "average" on ``count``, 1 for the BiLSTM on ``count``); each single
  Transformer head can go uniform at no cost, and so can all of layer 1, but a uniform layer 0
  loses 47 points on ``contains`` (its two heads are redundant); on ``count`` nothing matters.
  MiniLM: 53 of 72 heads keep cosine ≥ 0.99 when made uniform (worst L4H5, 0.965); a whole
  uniform layer 0.98 (L0) down to 0.82 (L5).
- Erasure (last layer): the BiLSTM flips after a median 17% of the keys in attention order on
  ``contains`` positives (often after the first, the ``key``; IG order the same; random 73%),
  33% on ``count`` where 64% never flip; the IG order is no faster for the BiLSTM, faster for
  the "average" encoder on ``count`` (22% vs 35%). The Transformer's last layer hardly flips
  the decision at all (85–99% of examples never flip, in any order).
- Adversarial: an attention within TVD 0.01 was found for every BiLSTM example; median max JSD
  0.42 on ``contains`` and 0.68 (≈ ln 2) on ``count``, where 80% exceed 0.5.
- Pruning: MiniLM keeps 90% of its cosine to the unpruned embeddings with 20 of 72 heads
  (28%) pruned in importance order, 10–20 heads in random orders; the Transformer classifier
  keeps its accuracy with 3 of its 4 heads pruned (75%) in importance order.

Budget: about 3–4 minutes on one CPU thread. Every number comes from the seed: two runs give
identical CSVs.

Run: ``python analyses/perturbation_studies.py [--smoke] [--out DIR]``; tables,
``permutation.png``, ``uniform.png``, ``erasure.png``, ``pruning.png`` and
``provenance.json`` go to ``runs/perturbation_studies/<UTC stamp>/``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from harness.runs import analysis_main
from torch import nn

from attnprobe.attribution.targets import Target
from attnprobe.core.lines import split_lines
from attnprobe.errors import EditNotAppliedError

DATA = Path(__file__).resolve().parent / "data"
TRANSFORMER = "transformer-classifier"
MINILM_TASK = "sentences"
LOG_ODDS = Target("log_odds:1-0", lambda output, inputs: output[:, 1] - output[:, 0])
SMALL_CHANGE = 0.01  # "the output barely moved": TVD / cosine distance below this
PEAKED = 0.5  # "peaked attention": max weight at least this


@dataclass
class Config:
    tasks: tuple[str, ...] = ("contains", "count")
    classifiers: tuple[str, ...] = ("bilstm-classifier", "average-classifier", TRANSFORMER)
    # the training recipe of attribution_truth.py
    n_train: int = 2000
    n_held_out: int = 500
    min_len: int = 4
    max_len: int = 12
    vocab_words: int = 16
    train_steps: int = 400
    batch_size: int = 32
    lr: float = 1e-2
    # MiniLM
    minilm: str = "minilm"
    n_sentences: int = 64  # importance texts; as many other texts for curves and uniform
    reference_sentence: str = "The cat sat on the mat."
    # 1. permutation
    n_permuted: int = 100  # held-out examples per (task, classifier)
    n_permuted_sentences: int = 32
    n_permutations: int = 100
    permuted_layers: tuple[int, ...] = (0, -1)  # every head of these layers (-1: the last)
    # 3. erasure
    erasure_models: tuple[str, ...] = ("bilstm-classifier", "average-classifier", TRANSFORMER)
    n_erased: int = 100
    ig_steps: int = 50
    # 4. adversarial
    adversarial_models: tuple[str, ...] = ("bilstm-classifier",)
    n_adversarial: int = 30
    eps: float = 0.01
    adversarial_steps: int = 500
    n_adversaries: int = 5
    adversarial_lr: float = 0.01
    # 5. importance and pruning
    n_importance: int = 500  # training examples scored per classifier
    pruning_points: int = 36  # points of MiniLM's curves (classifiers: after every head)
    n_random_orders: int = 3
    drop: float = 0.1  # "before the metric drops by 10%"
    num_threads: int = 1
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        return cls(tasks=("count",), n_train=64, n_held_out=24, train_steps=3,
                   n_sentences=4, n_permuted=3, n_permuted_sentences=2, n_permutations=8,
                   n_erased=3, ig_steps=4, n_adversarial=2, adversarial_steps=5,
                   n_importance=16, pruning_points=6, n_random_orders=1)


# ----------------------------------------------------------------------------- subjects
@dataclass
class Subject:
    """One model under study: a trained classifier on one task, or MiniLM on sentences."""

    name: str
    task: str
    model: nn.Module
    tok: Any
    kind: str  # "classifier" | "embedding"
    texts: list[str]  # evaluation texts (held out)
    labels: torch.Tensor | None = None  # classifiers: labels of ``texts``
    fit_texts: list[str] | None = None  # importance texts (classifiers: training texts)
    fit_labels: torch.Tensor | None = None

    @property
    def n_layers(self) -> int:
        from attnprobe.perturb import attention_sizes

        return attention_sizes(self.model)[0]

    @property
    def n_heads(self) -> int:
        from attnprobe.perturb import attention_sizes

        return attention_sizes(self.model)[1]

    @property
    def layer(self) -> int:
        """The layer that is permuted / erased: the last (the J&W models have one)."""
        return self.n_layers - 1

    def tag(self) -> dict[str, str]:
        return {"task": self.task, "model": self.name}


def inputs_of(subject: Subject, texts: list[str]) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids`` / ``attention_mask`` (the encoding every library call uses)."""
    from attnprobe.inputs.text import encode

    batch = encode(subject.model, subject.tok, texts)
    return {k: batch[k] for k in ("input_ids", "attention_mask")}


def repeat(inputs: dict[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    """``n`` copies of a one-example batch."""
    return {k: v.expand(n, *v.shape[1:]).contiguous() for k, v in inputs.items()}


def pooled(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sentence-transformers mean pooling ``[batch, seq, d] -> [batch, d]``."""
    weights = mask[..., None].to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1)


def readout(subject: Subject, output: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Classifier logits ``[batch, classes]`` or the pooled embedding ``[batch, d]``."""
    if subject.kind == "classifier":
        return output
    return pooled(output.last_hidden_state, inputs["attention_mask"])


def forward(subject: Subject, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return readout(subject, subject.model(**inputs), inputs)


def clean_pass(subject: Subject, inputs: dict[str, torch.Tensor], layer: int | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Unperturbed readout of one example and the rows of ``layer`` (default: the last) that
    reach the output, ``[head, row, key]`` (padding stripped).

    J&W: their one query row; the Transformer's last layer: the ``[BOS]`` row (pooling
    ``bos``, right padding: the first real token); MiniLM (mean pooling) and any earlier
    layer: every real row.
    """
    import attnprobe

    layer = subject.layer if layer is None else layer
    with torch.no_grad(), attnprobe.capture(subject.model, layers=[layer]) as cap:
        out = forward(subject, inputs)
    pattern = cap.maps[0].pattern[0]  # [head, query, key]
    pooled_row = subject.kind == "classifier" and layer == subject.layer
    return out, pattern[:, :1] if pooled_row else pattern


def change(subject: Subject, before: torch.Tensor, after: torch.Tensor) -> dict[str, torch.Tensor]:
    from attnprobe.perturb import output_change

    return output_change(subject.kind, before.expand_as(after), after)


def measure_name(subject: Subject) -> str:
    return "tvd" if subject.kind == "classifier" else "cosine_distance"


# ----------------------------------------------------------------------------- training
def train_subjects(cfg: Config) -> tuple[list[Subject], list[dict]]:
    from attnprobe.tasks.classification import train_reference_classifiers

    subjects, training = [], []
    for trained in train_reference_classifiers(
            cfg.tasks, cfg.classifiers, n_train=cfg.n_train, n_held_out=cfg.n_held_out,
            steps=cfg.train_steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed,
            min_len=cfg.min_len, max_len=cfg.max_len, vocab_words=cfg.vocab_words):
        result, held = dict(trained.result), trained.held_out
        result.pop("seconds")  # tables hold only what the seed determines
        training.append({"task": trained.task, "model": trained.name, **result})
        fit = trained.train.select(range(min(cfg.n_importance, len(trained.train))))
        subjects.append(Subject(trained.name, trained.task, trained.model, trained.tokenizer,
                                "classifier", list(held.texts), held.labels, list(fit.texts),
                                fit.labels))
    return subjects, training


def load_minilm(cfg: Config) -> Subject:
    import attnprobe

    model, tok = attnprobe.load_model(cfg.minilm)
    corpus = (DATA / "census_sentences.txt").read_text(encoding="utf-8")
    lines = [s for s in split_lines(corpus) if s.strip()]
    n = cfg.n_sentences
    needed = 2 * n + cfg.n_permuted_sentences
    if len(lines) < needed:
        raise ValueError(f"need {needed} census sentences, the file has {len(lines)}")
    # disjoint: importance texts, evaluation texts (uniform, pruning), permuted texts
    return Subject("minilm", MINILM_TASK, model, tok, "embedding", lines[n:2 * n],
                   fit_texts=lines[:n])


def permuted_texts(cfg: Config, subject: Subject) -> list[str]:
    if subject.kind == "embedding":
        lines = split_lines((DATA / "census_sentences.txt").read_text(encoding="utf-8"))
        start = 2 * cfg.n_sentences
        return lines[start:start + cfg.n_permuted_sentences]
    return subject.texts[:cfg.n_permuted]


# ----------------------------------------------------------------------------- 1. permutation
def permuted_layers(cfg: Config, subject: Subject) -> list[int]:
    """``cfg.permuted_layers`` as model indices (negative from the end), without repeats."""
    return sorted({layer % subject.n_layers for layer in cfg.permuted_layers})


def permutation_study(cfg: Config, subject: Subject, layer: int,
                      skipped: list[dict]) -> list[dict]:
    """J&W §5.2: ``n_permutations`` permutations of every head of ``layer`` per example."""
    from attnprobe.perturb import Scope, make_intervention, perturbed

    scope = Scope(layers=(layer,))
    generator = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for i, text in enumerate(permuted_texts(cfg, subject)):
        inputs = inputs_of(subject, [text])
        before, read = clean_pass(subject, inputs, layer)
        copies = repeat(inputs, cfg.n_permutations)
        try:
            with torch.no_grad(), perturbed(subject.model, make_intervention("permute"), scope,
                                            generator=generator):
                after = forward(subject, copies)
        except EditNotAppliedError as err:
            reason = str(err).splitlines()[0]
            valid = read[read > 0]
            if len(valid) and bool((valid == valid[0]).all()):
                reason = "every key has the same weight: a permutation changes nothing"
            skipped.append({**subject.tag(), "experiment": f"permutation L{layer}",
                            "example_id": i, "reason": reason})
            continue
        delta = change(subject, before, after)
        values = delta[measure_name(subject)].double()
        row = {**subject.tag(), "layer": layer, "example_id": i,
               "n_tokens": int(inputs["attention_mask"].sum()),
               "max_attention": float(read.max(-1).values.mean()),
               "measure": measure_name(subject), "median_change": float(values.median()),
               "mean_change": float(values.mean()), "max_change": float(values.max())}
        if subject.kind == "classifier":
            row["label"] = int(subject.labels[i])
            row["predicted"] = int(before.argmax(-1))
            row["flip_rate"] = float(delta["flip"].mean())
        rows.append(row)
    return rows


def spearman(a: pd.Series, b: pd.Series) -> float:
    if len(a) < 3:
        return float("nan")
    return float(a.rank().corr(b.rank()))


def permutation_summary(table: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (task, model, layer), sub in table.groupby(["task", "model", "layer"], sort=False):
        peaked = sub[sub["max_attention"] >= PEAKED]
        small = sub["median_change"] < SMALL_CHANGE
        rows.append({
            "task": task, "model": model, "layer": layer, "measure": sub["measure"].iloc[0],
            "n_examples": len(sub), "median_max_attention": sub["max_attention"].median(),
            "median_median_change": sub["median_change"].median(),
            "p90_median_change": sub["median_change"].quantile(0.9),
            "share_small": float(small.mean()), "n_peaked": len(peaked),
            "share_small_peaked": float((peaked["median_change"] < SMALL_CHANGE).mean())
            if len(peaked) else float("nan"),
            "mean_flip_rate": sub["flip_rate"].mean() if "flip_rate" in sub else float("nan"),
            "spearman_max_attention_change": spearman(sub["max_attention"],
                                                      sub["median_change"])})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- 2. uniform
def uniform_study(subject: Subject) -> list[dict]:
    """Kovaleva §4.6 / W&P: each head, then each layer, replaced by uniform weights."""
    from attnprobe.perturb import Scope, make_intervention, perturbed
    from attnprobe.types import head_id

    inputs = inputs_of(subject, subject.texts)
    with torch.no_grad():
        before = forward(subject, inputs)
    units = [("head", layer, head) for layer in range(subject.n_layers)
             for head in range(subject.n_heads)]
    if subject.n_heads > 1:
        units += [("layer", layer, None) for layer in range(subject.n_layers)]
    base_acc = None
    if subject.kind == "classifier":
        base_acc = float((before.argmax(-1) == subject.labels).double().mean())
    rows = []
    for unit, layer, head in units:
        scope = Scope(layers=(layer,), heads=None if head is None else (head,))
        with torch.no_grad(), perturbed(subject.model, make_intervention("uniform"), scope):
            after = forward(subject, inputs)
        delta = change(subject, before, after)
        row = {**subject.tag(), "unit": unit, "layer": layer,
               "head": pd.NA if head is None else head,
               "head_id": f"L{layer}" if head is None else head_id(layer, head),
               "n_examples": len(subject.texts)}
        if subject.kind == "classifier":
            acc = float((after.argmax(-1) == subject.labels).double().mean())
            row.update(mean_tvd=float(delta["tvd"].double().mean()),
                       flip_rate=float(delta["flip"].double().mean()), accuracy=acc,
                       accuracy_change=acc - base_acc)
        else:
            distance = delta["cosine_distance"].double()
            row.update(mean_cosine_similarity=float(1 - distance.mean()),
                       max_cosine_distance=float(distance.max()))
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- 3. erasure
def erasure_study(cfg: Config, subject: Subject, skipped: list[dict]) -> list[dict]:
    """S&S §6.2: erase keys one more per step in three orders until the decision flips."""
    from attnprobe.attribution import attribute
    from attnprobe.perturb import Scope, make_intervention, perturbed

    texts = subject.texts[:cfg.n_erased]
    explained = attribute(subject.model, subject.tok, texts, LOG_ODDS,
                          methods=["integrated_gradients"], n_steps=cfg.ig_steps,
                          seed=cfg.seed)
    scope = Scope(layers=(subject.layer,))
    generator = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for i, (text, ig) in enumerate(zip(texts, explained, strict=True)):
        inputs = inputs_of(subject, [text])
        before, read = clean_pass(subject, inputs)
        weights = read.mean(0)[0].double()  # [key]: the head-mean readout row
        keys = (weights > 0).nonzero().flatten()  # the erasable items
        n = len(keys)
        predicted = int(before.argmax(-1))
        if n < 2:
            skipped.append({**subject.tag(), "experiment": "erasure", "example_id": i,
                            "reason": f"{n} key(s) with weight > 0: nothing to erase"})
            continue
        sign = 1.0 if predicted == 1 else -1.0  # IG of the predicted class's log-odds
        support = sign * ig.scores[keys]
        orders = {
            "attention": keys[weights[keys].argsort(descending=True, stable=True)],
            "integrated_gradients": keys[support.argsort(descending=True, stable=True)],
            "random": keys[torch.randperm(n, generator=generator)],
        }
        seq = inputs["input_ids"].shape[1]
        for order, ranked in orders.items():
            mask = torch.zeros(n - 1, 1, 1, seq, dtype=torch.bool)
            for k in range(1, n):  # row k - 1 erases the first k ranked keys
                mask[k - 1, 0, 0, ranked[:k]] = True
            with torch.no_grad(), perturbed(subject.model, make_intervention("erase", keys=mask),
                                            scope):
                after = forward(subject, repeat(inputs, n - 1))
            flips = (after.argmax(-1) != predicted).nonzero().flatten()
            k = int(flips[0]) + 1 if len(flips) else None
            rows.append({**subject.tag(), "example_id": i, "label": int(subject.labels[i]),
                         "predicted": predicted, "order": order, "n_keys": n,
                         "flipped": k is not None,
                         "n_erased": k if k is not None else pd.NA,
                         "frac_erased": k / n if k is not None else float("nan"),
                         "mass_erased": float(weights[ranked[:k]].sum()) if k is not None
                         else float("nan")})
    return rows


def erasure_summary(table: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (task, model, order), sub in table.groupby(["task", "model", "order"], sort=False):
        flipped = sub[sub["flipped"]]
        by_label = {label: float((~part["flipped"]).mean())
                    for label, part in sub.groupby("label")}
        rows.append({"task": task, "model": model, "order": order, "n_examples": len(sub),
                     "share_never_flip": float((~sub["flipped"]).mean()),
                     "share_never_flip_label0": by_label.get(0, float("nan")),
                     "share_never_flip_label1": by_label.get(1, float("nan")),
                     "median_frac_erased": flipped["frac_erased"].median(),
                     "mean_frac_erased": flipped["frac_erased"].mean(),
                     "median_mass_erased": flipped["mass_erased"].median(),
                     "share_flip_after_one": float((sub["n_erased"] == 1).fillna(False).mean())})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- 4. adversarial
def adversarial_study(cfg: Config, subject: Subject) -> list[dict]:
    """J&W §5.3 on the single attention of a J&W classifier."""
    from attnprobe.perturb import adversarial_attention

    rows = []
    for i, text in enumerate(subject.texts[:cfg.n_adversarial]):
        inputs = inputs_of(subject, [text])
        before, read = clean_pass(subject, inputs)
        result = adversarial_attention(subject.model, inputs, layer=subject.layer,
                                       heads=[0], output_fn=lambda out: out.softmax(-1),
                                       eps=cfg.eps, n_adversaries=cfg.n_adversaries,
                                       steps=cfg.adversarial_steps, lr=cfg.adversarial_lr,
                                       seed=cfg.seed)
        top = result.max_jsd_within_eps
        rows.append({**subject.tag(), "example_id": i, "label": int(subject.labels[i]),
                     "predicted": int(before.argmax(-1)),
                     "n_keys": int((read[0, 0] > 0).sum()),
                     "max_attention": float(read.max()), "eps": cfg.eps,
                     "max_jsd_within_eps": float("nan") if top is None else top,
                     "n_within_eps": result.n_within_eps, "min_tvd": min(result.tvd)})
    return rows


def adversarial_summary(table: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (task, model), sub in table.groupby(["task", "model"], sort=False):
        jsd = sub["max_jsd_within_eps"]
        rows.append({"task": task, "model": model, "eps": sub["eps"].iloc[0],
                     "n_examples": len(sub), "share_found": float(jsd.notna().mean()),
                     "median_max_jsd": jsd.median(), "mean_max_jsd": jsd.mean(),
                     "share_jsd_over_0.5": float((jsd > 0.5).mean()),
                     "ln2": math.log(2)})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- 5. importance
def label_lookup(subject: Subject, texts: list[str], labels: torch.Tensor
                 ) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """Labels of a batch found from its token ids (independent of batching and padding)."""
    ids = inputs_of(subject, texts)
    table = {}
    for row, mask, label in zip(ids["input_ids"], ids["attention_mask"], labels.tolist(),
                                strict=True):
        table[tuple(row[mask.bool()].tolist())] = label

    def lookup(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.tensor([table[tuple(row[mask.bool()].tolist())] for row, mask in
                             zip(inputs["input_ids"], inputs["attention_mask"], strict=True)])

    return lookup


def importance_study(cfg: Config, subject: Subject) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
    """Michel §4: importance per head, then pruning curves (importance order and random)."""
    from attnprobe.perturb import head_importance, pruning_curve, similarity_loss

    if subject.kind == "classifier":
        fit_labels = label_lookup(subject, subject.fit_texts, subject.fit_labels)
        eval_labels = label_lookup(subject, subject.texts, subject.labels)

        def loss_fn(output: torch.Tensor, inputs: dict) -> torch.Tensor:
            return F.cross_entropy(output, fit_labels(inputs), reduction="none")

        def metric_fn(output: torch.Tensor, inputs: dict) -> float:
            return float((output.argmax(-1) == eval_labels(inputs)).double().mean())

        points = None
    else:
        loss_fn = similarity_loss(cfg.reference_sentence, subject.model, subject.tok)
        with torch.no_grad():
            reference = forward(subject, inputs_of(subject, subject.texts))

        def metric_fn(output: Any, inputs: dict) -> float:
            emb = pooled(output.last_hidden_state, inputs["attention_mask"])
            return float(F.cosine_similarity(emb.double(), reference.double(), dim=-1).mean())

        points = cfg.pruning_points
    importance = head_importance(subject.model, subject.tok, subject.fit_texts, loss_fn)
    importance = importance.drop(columns=["stack", "kind"]).assign(**subject.tag())
    importance["rank"] = importance["importance"].rank(method="first").astype(int)
    heads = list(zip(importance["layer"], importance["head"], strict=True))
    ranked = importance.sort_values(["importance", "layer", "head"], kind="stable")
    orders = {"importance": list(zip(ranked["layer"], ranked["head"], strict=True))}
    generator = torch.Generator().manual_seed(cfg.seed)
    for r in range(cfg.n_random_orders):
        orders[f"random-{r}"] = [heads[j] for j in torch.randperm(len(heads),
                                                                  generator=generator)]
    curves = []
    for name, order in orders.items():
        steps = None if points is None else min(points, len(order))
        curve = pruning_curve(subject.model, subject.tok, subject.texts, metric_fn, order,
                              steps=steps)
        curve["metric_relative"] = curve["metric"] / curve["metric"].iloc[0]
        curves.append(curve.assign(order=name, **subject.tag()))
    return importance, curves


def prunable(curve: pd.DataFrame, drop: float) -> tuple[float, int]:
    """Largest share (and count) of heads pruned while every point so far keeps at least
    ``1 - drop`` of the unpruned metric."""
    kept = curve["metric"] >= (1 - drop) * curve["metric"].iloc[0]
    ok = kept.cummin()
    last = curve[ok].iloc[-1]
    return float(last["share_pruned"]), int(last["n_pruned"])


def pruning_summary(table: pd.DataFrame, drop: float) -> pd.DataFrame:
    rows = []
    for (task, model, order), curve in table.groupby(["task", "model", "order"], sort=False):
        share, count = prunable(curve.reset_index(drop=True), drop)
        rows.append({"task": task, "model": model, "order": order,
                     "metric_unpruned": curve["metric"].iloc[0],
                     "metric_all_pruned": curve["metric"].iloc[-1], "drop": drop,
                     "share_prunable": share, "heads_prunable": count,
                     "heads_total": int(curve["n_pruned"].iloc[-1])})  # orders cover all
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- run
def frame(rows: list[dict], integers: tuple[str, ...] = ()) -> pd.DataFrame:
    """Rows as a frame; ``integers`` are integer columns that may hold NA (nullable Int64)."""
    table = pd.DataFrame(rows)
    for name in integers:
        if name in table:
            table[name] = table[name].astype("Int64")
    return table


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Train the classifiers, load MiniLM, run the five studies; tidy tables, nothing printed."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.num_threads)
    try:
        classifiers, training = train_subjects(cfg)
        minilm = load_minilm(cfg)
        skipped: list[dict] = []
        permutation, uniform, erasure, adversarial = [], [], [], []
        importance, pruning = [], []
        for subject in [*classifiers, minilm]:
            for layer in permuted_layers(cfg, subject):
                permutation += permutation_study(cfg, subject, layer, skipped)
            uniform += uniform_study(subject)
            if subject.name in cfg.erasure_models:
                erasure += erasure_study(cfg, subject, skipped)
            if subject.name in cfg.adversarial_models:
                adversarial += adversarial_study(cfg, subject)
            if subject.kind == "embedding" or subject.name == TRANSFORMER:
                scores, curves = importance_study(cfg, subject)
                importance.append(scores)
                pruning += curves
    finally:
        torch.set_num_threads(threads)
    first = ["task", "model"]

    def ordered(table: pd.DataFrame) -> pd.DataFrame:
        return table[first + [c for c in table.columns if c not in first]] if len(table) \
            else table

    permutation_t = ordered(frame(permutation))
    erasure_t = ordered(frame(erasure, ("n_erased",)))
    adversarial_t = ordered(frame(adversarial))
    pruning_t = ordered(pd.concat(pruning, ignore_index=True)) if pruning else pd.DataFrame()
    return {
        "training": pd.DataFrame(training),
        "permutation_summary": permutation_summary(permutation_t),
        "permutation": permutation_t,
        "uniform": ordered(frame(uniform, ("head",))),
        "erasure_summary": erasure_summary(erasure_t) if len(erasure_t) else pd.DataFrame(),
        "erasure": erasure_t,
        "adversarial_summary": adversarial_summary(adversarial_t) if len(adversarial_t)
        else pd.DataFrame(),
        "adversarial": adversarial_t,
        "importance": ordered(pd.concat(importance, ignore_index=True)) if importance
        else pd.DataFrame(),
        "pruning_summary": pruning_summary(pruning_t, cfg.drop) if len(pruning_t)
        else pd.DataFrame(),
        "pruning": pruning_t,
        "skipped": pd.DataFrame(skipped, columns=["task", "model", "experiment",
                                                  "example_id", "reason"]),
    }


# ----------------------------------------------------------------------------- plots
def plot(tables: dict[str, pd.DataFrame], path: Path) -> list[Path]:
    """``permutation.png`` (median change vs max attention per model), ``uniform.png``
    (layer × head heatmaps), ``erasure.png`` (fraction erased before the flip per order) and
    ``pruning.png`` (metric vs share of heads pruned)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    written = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        out = path / name
        fig.savefig(out, dpi=110)
        plt.close(fig)
        written.append(out)

    perm = tables["permutation"]
    if len(perm):
        panels = perm[["task", "model", "layer"]].drop_duplicates().values.tolist()
        cols = min(4, len(panels))
        rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(4.2 * cols, 3.4 * rows))
        for ax, (task, model, layer) in zip(axes.flat, panels, strict=False):
            sub = perm[(perm["task"] == task) & (perm["model"] == model)
                       & (perm["layer"] == layer)]
            hue = None
            if "label" in sub and sub["label"].notna().all():
                sub = sub.assign(label=sub["label"].astype(int))
                hue = "label"
            sns.scatterplot(data=sub, x="max_attention", y="median_change", hue=hue, ax=ax,
                            s=18, palette="coolwarm" if hue else None)
            ax.set_xlim(0, 1.02)
            ax.set_ylim(bottom=0)
            ax.set_xlabel("max attention weight")
            ax.set_ylabel(f"median {sub['measure'].iloc[0]} over permutations")
            ax.set_title(f"{model.replace('-classifier', '')} / {task}: layer {layer} permuted",
                         fontsize=9)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        save(fig, "permutation.png")

    uniform = tables["uniform"]
    if len(uniform):
        groups = [(t, m) for (t, m), sub in uniform.groupby(["task", "model"], sort=False)
                  if sub["head"].notna().sum() > 1]
        if groups:
            fig, axes = plt.subplots(len(groups), 1, squeeze=False,
                                     figsize=(9, 2.2 + 0.45 * uniform["layer"].max()
                                              * len(groups)))
            for ax, (task, model) in zip(axes[:, 0], groups, strict=True):
                sub = uniform[(uniform["task"] == task) & (uniform["model"] == model)]
                if "accuracy_change" in sub and sub["accuracy_change"].notna().all():
                    value, fmt = "accuracy_change", ".2f"
                else:  # MiniLM: 1 - mean cosine similarity to the unperturbed embedding
                    value, fmt = "cosine_distance", ".3f"
                    sub = sub.assign(cosine_distance=1 - sub["mean_cosine_similarity"])
                grid = sub.assign(column=sub["head"].astype("object").where(
                    sub["head"].notna(), "all").astype(str))
                table = grid.pivot(index="layer", columns="column", values=value)
                heads = sorted((c for c in table.columns if c != "all"), key=int)
                table = table[heads + (["all"] if "all" in table.columns else [])]
                sns.heatmap(table.astype(float), annot=True, fmt=fmt, cmap="viridis", ax=ax,
                            annot_kws={"fontsize": 6}, cbar_kws={"label": value})
                ax.set_xlabel("head (all = whole layer)")
                ax.set_title(f"{model} / {task}: uniform weights", fontsize=9)
            save(fig, "uniform.png")

    erasure = tables["erasure_summary"]
    if len(erasure):
        erasure = erasure.assign(pair=erasure["model"].str.replace("-classifier", "")
                                 + "\n" + erasure["task"])
        fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
        sns.barplot(data=erasure, x="pair", y="median_frac_erased", hue="order", ax=axes[0])
        axes[0].set_ylabel("median fraction of keys erased at the flip")
        sns.barplot(data=erasure, x="pair", y="share_never_flip", hue="order", ax=axes[1])
        axes[1].set_ylabel("share of examples that never flip")
        for ax in axes:
            ax.set_xlabel("")
            ax.set_ylim(0, 1.05)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=7)
        save(fig, "erasure.png")

    pruning = tables["pruning"]
    if len(pruning):
        pairs = pruning[["task", "model"]].drop_duplicates().values.tolist()
        fig, axes = plt.subplots(1, len(pairs), squeeze=False, figsize=(4.5 * len(pairs), 3.6))
        for ax, (task, model) in zip(axes[0], pairs, strict=True):
            sub = pruning[(pruning["task"] == task) & (pruning["model"] == model)]
            n_random = sub["order"].str.startswith("random").groupby(sub["order"]).any().sum()
            first_random = True
            for order, curve in sub.groupby("order", sort=False):
                random = order.startswith("random")
                label = order
                if random:
                    label = f"random orders ({n_random})" if first_random else None
                    first_random = False
                ax.plot(curve["share_pruned"], curve["metric"], marker="" if random else ".",
                        linestyle="--" if random else "-", alpha=0.6 if random else 1.0,
                        color="grey" if random else "tab:blue", label=label)
            ax.axhline(0.9 * sub["metric"].iloc[0], color="red", linewidth=0.6,
                       label="90% of unpruned")
            ax.set_xlabel("share of heads pruned")
            ax.set_ylabel("accuracy" if model != "minilm" else "cosine to unpruned")
            ax.set_title(f"{model} / {task}", fontsize=9)
            ax.legend(fontsize=7)
        save(fig, "pruning.png")
    return written


def main(argv: list[str] | None = None) -> None:
    analysis_main("perturbation_studies", __doc__, Config, run, plot, argv,
                  show=["training", "permutation_summary", "erasure_summary",
                        "adversarial_summary", "pruning_summary", "skipped"])


if __name__ == "__main__":
    main()
