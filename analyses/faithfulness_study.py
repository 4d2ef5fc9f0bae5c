"""Which explanation is faithful? Erasure tests of every attention view and attribution method
on four models, with bootstrap confidence intervals (issue 26, item 4).

Every source is scored by :func:`attnprobe.faithfulness.evaluate` under the same removal
procedure (the default, ``delete``: the token is cut out, as ERASER and ferret do): AOPC
comprehensiveness and sufficiency over the removal levels 1, 5, 10, 20, 50 %, the area
between the LeRF and MoRF deletion curves (ABPC) and Kendall τ with leave-one-out, each a
mean over texts with a 95 % percentile-bootstrap interval, against a random-order baseline.
Sources: every registered attribution method (``attn_lrp`` where it supports the model) and
every attention view the model can serve, a per-layer view read at the last layer.

Models and texts:

- ``induction``: ``ref:induction`` (2-layer attention-only copy model). Each prompt is
  ``[BOS]``, a segment of distinct random symbols and its first ``k`` symbols again; the
  target is the next token, kept only where the model predicts the copy. The decisive token
  is the *copy source*, the token after the earlier occurrence of the last token: ``truth``
  gives, per source, the share of prompts whose highest-scored token (``[BOS]`` and the last
  token left out) is the copy source, with a bootstrap interval and its chance level.
- ``truth:<task>``: the synthetic key-token tasks of ``analyses/attribution_truth.py``
  (``contains``, ``count``), a 2-layer Transformer classifier trained by the same recipe,
  explained for the log-odds ``logit_1 − logit_0`` on held-out texts.
- ``minilm``: MiniLM (``ap.load_model("minilm")``), target ``similarity:<anchor>`` (cosine of
  mean-pooled embeddings with a fixed sentence) over sentences of
  ``analyses/data/census_sentences.txt``.
- ``classifier``: MiniLM fine-tuned (``BertForSequenceClassification``) on the word-order
  task of ``analyses/finetune_diff.py`` (a sentence as written = class 1, shuffled = 0),
  target ``class:1`` on held-out texts.

Tables: ``leaderboard`` (model, source, kind, the summary metrics with their intervals,
rank by AOPC comprehensiveness), ``curves`` (mean deletion/insertion curves with bands),
``truth`` (induction copy-source top-1 shares), ``induction_prompts`` (each prompt and its
copy source position, ``[BOS]`` = 0), ``models`` (texts, tokens, sources, sources
the model does not support and why, accuracy, seconds); ``leaderboard.md`` holds one table
per model (pasted into the README).

Budget: about 20 minutes on 2 CPU cores at the default sizes (40 induction prompts, 24 texts
per truth task, 40 MiniLM sentences, 30 classifier texts; Integrated Gradients with 20 steps).

Run: ``python analyses/faithfulness_study.py [--smoke] [--out DIR]``; results go to
``runs/faithfulness_study/<UTC stamp>/``.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import transformers
from attribution_truth import LOG_ODDS
from attribution_truth import Config as TruthConfig
from finetune_diff import DATA, word_order_task
from finetune_diff import Config as FinetuneConfig
from finetune_diff import load as load_encoder
from harness.leaderboard_md import leaderboard_md
from harness.runs import analysis_main, torch_threads
from torch import nn

import attnprobe
from attnprobe.attribution.attribution_options import AttributionOptions
from attnprobe.attribution.method_base import METHODS
from attnprobe.attribution.targets import parse_target
from attnprobe.attribution.view_base import VIEWS, View
from attnprobe.attribution.views import build_views
from attnprobe.capture.info import attention_sizes, model_scope
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.lines import split_lines
from attnprobe.errors import InputError
from attnprobe.faithfulness import evaluate
from attnprobe.faithfulness.metrics import bootstrap_ci
from attnprobe.faithfulness.result import Faithfulness
from attnprobe.faithfulness.sources import SourceJob, explain_text
from attnprobe.models.induction import SYMBOLS
from attnprobe.tasks.classification import accuracy, train_classifier
from attnprobe.tasks.keytoken import KeyTokenData


@dataclass
class Config:
    # ref:induction
    n_induction: int = 40
    segment: tuple[int, int] = (10, 16)  # distinct random symbols, both ends included
    copied: tuple[int, int] = (3, 8)  # symbols of the segment repeated before the prediction
    # the synthetic key-token tasks (attribution_truth's recipe)
    truth_tasks: tuple[str, ...] = ("contains", "count")
    truth_model: str = "transformer-classifier"
    truth_train: int = 2000
    truth_steps: int = 400
    n_truth: int = 24
    # MiniLM similarity and the fine-tuned classifier
    encoder: str = "minilm"  # "tiny-bert": a random 2 x 2 BERT with MiniLM's tokenizer
    n_similarity: int = 40
    classifier_train: int = 400  # sentences (each as written and shuffled)
    classifier_steps: int = 100
    classifier_lr: float = 5e-5
    n_classifier: int = 30
    # the evaluation
    n_steps: int = 20  # Integrated Gradients path points
    curve_steps: int = 10
    removal: str = "delete"
    num_threads: int = 1
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        return cls(n_induction=2, truth_tasks=("contains",), truth_train=64, truth_steps=3,
                   n_truth=2, encoder="tiny-bert", n_similarity=2, classifier_train=8,
                   classifier_steps=2, classifier_lr=1e-3, n_classifier=2, n_steps=4,
                   curve_steps=4)


@dataclass
class Study:
    """One model's texts and target, ready for :func:`evaluate`."""

    name: str
    model: nn.Module
    tokenizer: Any
    texts: list[str]
    target: Any
    accuracy: float | None = None
    query: str = "auto"  # the row the views read ("auto": [CLS] for an encoder)
    only_methods: tuple[str, ...] | None = None  # None: every method the model supports


# ------------------------------------------------------------------------------- sources
def supported_sources(model: nn.Module) -> tuple[tuple[str, ...], tuple[View, ...], list[str]]:
    """Every registered method and view that can read this model (each checked before any
    forward, as :func:`evaluate` checks them); the rest named with the reason."""
    methods, views, refused = [], [], []
    for name in METHODS.names():
        check = getattr(METHODS.get(name)(), "check", None)
        try:
            if check is not None:
                check(model)
            methods.append(name)
        except InputError as err:
            refused.append(f"{name}: {err}")
    for name in VIEWS.names():
        try:
            views += build_views([name], model=model)
        except InputError as err:
            refused.append(f"{name}: {err}")
    return tuple(methods), tuple(views), refused


def source_job(model: nn.Module, tokenizer: Any, target: Any, methods: tuple[str, ...],
               views: tuple[View, ...], n_steps: int, query: str = "auto") -> SourceJob:
    """The job :func:`evaluate` builds for its sources, with its defaults (views read at the
    last layer), so the scores it ranks by can be looked at."""
    scope = model_scope(model, None)
    last = max(layer for layer in range(attention_sizes(model)[0]) if scope.wants_layer(layer))
    return SourceJob(model, tokenizer, parse_target(target, model, tokenizer), methods, views,
                     scope, query, last, False, CorpusOptions(progress=False),
                     AttributionOptions(n_steps=n_steps))


# ------------------------------------------------------------------------------- models
def induction_study(cfg: Config) -> tuple[Study, list[int]]:
    """Prompts the model completes by copying, and the copy source position of each."""
    model, tok = attnprobe.load_model("ref:induction")
    generator = torch.Generator().manual_seed(cfg.seed)
    texts, sources = [], []
    while len(texts) < cfg.n_induction:
        m = int(torch.randint(cfg.segment[0], cfg.segment[1] + 1, (1,), generator=generator))
        k = int(torch.randint(cfg.copied[0], cfg.copied[1] + 1, (1,), generator=generator))
        segment = torch.randperm(len(SYMBOLS), generator=generator)[:m].tolist()
        words = [SYMBOLS[s] for s in segment + segment[:k]]
        # [BOS] at 0, the segment at 1..m: the last token segment[k-1] first occurs at k, so
        # the token to copy is at k + 1
        ids = tok(" ".join(words), return_tensors="pt")["input_ids"]
        with torch.no_grad():
            predicted = int(model(ids)[0, -1].argmax())
        if predicted == int(ids[0, k + 1]):  # only prompts the model completes by copying
            texts.append(" ".join(words))
            sources.append(k + 1)
    return Study("induction", model, tok, texts, "next-token"), sources


def copy_top1(job: SourceJob, study: Study, sources: list[int]) -> pd.DataFrame:
    """Per source: share of prompts whose top-scored candidate (not ``[BOS]``, not the last
    token) is the copy source, with its bootstrap interval and chance (mean 1 / candidates);
    and the share whose top candidate is the copy source or the token before it (the earlier
    occurrence of the last token: the induction head finds the copy source through it, so
    removing it breaks the copy too)."""
    hits: dict[tuple[str, str], list[float]] = {}
    pair: dict[str, list[float]] = {}
    chance = []
    for i, (text, source) in enumerate(zip(study.texts, sources, strict=True)):
        given = dict(study.tokenizer(text, return_tensors="pt"))
        found, _ = explain_text(job, str(i), given)
        n = given["input_ids"].shape[1]
        chance.append(1 / (n - 2))
        for a in found:
            scores = a.scores.to(torch.float64).numpy()[1:n - 1]  # candidates 1 .. n-2
            kind = "attribution" if a.method in job.methods else "attention"
            top = int(np.argmax(scores)) + 1
            hits.setdefault((a.method, kind), []).append(float(top == source))
            pair.setdefault(a.method, []).append(float(top in (source - 1, source)))
    rows = []
    for (name, kind), values in hits.items():
        mean, low, high = bootstrap_ci(np.array(values), seed=0)
        either, either_low, either_high = bootstrap_ci(np.array(pair[name]), seed=0)
        rows.append({"model": study.name, "source": name, "source_kind": kind,
                     "copy_source_top1": mean, "low": low, "high": high,
                     "match_or_source_top1": either, "match_or_source_low": either_low,
                     "match_or_source_high": either_high, "n": len(values),
                     "chance": float(np.mean(chance))})
    return pd.DataFrame(rows).sort_values("copy_source_top1", ascending=False,
                                          kind="stable").reset_index(drop=True)


def truth_studies(cfg: Config) -> list[Study]:
    """The key-token tasks' Transformer classifiers, trained as attribution_truth trains them."""
    from attnprobe.tasks.classification import train_reference_classifiers

    recipe = TruthConfig()
    studies = []
    for trained in train_reference_classifiers(
            cfg.truth_tasks, (cfg.truth_model,), n_train=cfg.truth_train,
            n_held_out=max(cfg.n_truth, 16), steps=cfg.truth_steps, seed=cfg.seed,
            batch_size=recipe.batch_size, lr=recipe.lr, min_len=recipe.min_len,
            max_len=recipe.max_len, vocab_words=recipe.vocab_words):
        held = trained.held_out
        studies.append(Study(f"truth:{trained.task}", trained.model, trained.tokenizer,
                             list(held.texts[:cfg.n_truth]), LOG_ODDS,
                             trained.result["held_out_accuracy"]))
    return studies


def census_sentences(n: int, offset: int = 0) -> list[str]:
    lines = split_lines((DATA / "census_sentences.txt").read_text(encoding="utf-8"))
    texts = [line.strip() for line in lines if len(line.split()) >= 5]
    if len(texts) < offset + n:
        raise InputError(f"census_sentences.txt has {len(texts)} sentences of 5+ words, "
                         f"fewer than {offset + n}")
    return texts[offset:offset + n]


def similarity_studies(cfg: Config) -> list[Study]:
    """Each sentence explained for its similarity to one fixed other sentence; the views
    read as everywhere (the ``[CLS]`` row), and again at the mean of the rows, the pooling
    this target uses (with saliency only, as evaluate() needs one method)."""
    model, tok = load_encoder(FinetuneConfig(model=cfg.encoder, seed=cfg.seed))
    anchor, *texts = census_sentences(cfg.n_similarity + 1)
    target = f"similarity:{anchor}"
    return [Study("minilm", model, tok, texts, target),
            Study("minilm:query=mean", model, tok, texts, target, query="mean",
                  only_methods=("saliency",))]


class _Logits(nn.Module):
    """``(input_ids, attention_mask) -> logits`` of a HF classifier, for ``train_classifier``
    (shares the classifier's parameters)."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.classifier(input_ids=input_ids, attention_mask=attention_mask).logits


def classifier_study(cfg: Config) -> Study:
    """The encoder fine-tuned on finetune_diff's word-order task (a BERT classifier, so every
    view can read it), explained for ``class:1`` (as written) on held-out texts."""
    encoder, tok = load_encoder(FinetuneConfig(model=cfg.encoder, seed=cfg.seed))
    n_held = max(cfg.n_classifier // 2, 1)
    sentences = census_sentences(cfg.classifier_train + n_held, offset=cfg.n_similarity + 1)
    train = word_order_task(sentences[:cfg.classifier_train], cfg.seed + 1)
    held: KeyTokenData = word_order_task(sentences[cfg.classifier_train:], cfg.seed + 2)
    torch.manual_seed(cfg.seed)  # the head's initial weights
    config = transformers.BertConfig(**{**encoder.config.to_dict(), "num_labels": 2})
    classifier = transformers.BertForSequenceClassification(config)
    classifier.bert.load_state_dict(copy.deepcopy(encoder.state_dict()), strict=False)
    result = train_classifier(_Logits(classifier), tok, train, steps=cfg.classifier_steps,
                              batch_size=16, lr=cfg.classifier_lr, seed=cfg.seed,
                              held_out=held)
    classifier.eval()
    return Study("classifier", classifier, tok, list(held.texts[:cfg.n_classifier]),
                 "class:1", accuracy(_Logits(classifier), tok, held)
                 if result["held_out_accuracy"] is None else result["held_out_accuracy"])


# ------------------------------------------------------------------------------- the run
def score(study: Study, cfg: Config) -> tuple[Faithfulness, SourceJob, dict]:
    """Every supported source of one model through :func:`evaluate`."""
    start = time.perf_counter()
    methods, views, refused = supported_sources(study.model)
    if study.only_methods is not None:
        methods = tuple(m for m in methods if m in study.only_methods)
    result = evaluate(study.model, study.tokenizer, study.texts, study.target,
                      methods=methods, views=views, removal=cfg.removal, query=study.query,
                      curve_steps=cfg.curve_steps, n_steps=cfg.n_steps, seed=cfg.seed)
    lengths = [study.tokenizer(t, return_tensors="pt")["input_ids"].shape[-1]
               for t in study.texts]
    record = {"model": study.name, "texts": len(study.texts),
              "mean_tokens": float(np.mean(lengths)), "target": str(getattr(
                  study.target, "spec", study.target))[:60],
              "sources": len(methods) + len(views), "removal": cfg.removal,
              "view_query": study.query,
              "held_out_accuracy": study.accuracy, "not_supported": " | ".join(refused),
              "seconds": round(time.perf_counter() - start, 1)}
    job = source_job(study.model, study.tokenizer, study.target, methods, views, cfg.n_steps,
                     study.query)
    return result, job, record


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    with torch_threads(cfg.num_threads):
        return _run(cfg)


def _run(cfg: Config) -> dict[str, pd.DataFrame]:
    board, curves, records, truth = [], [], [], []
    induction, copy_sources = induction_study(cfg)
    builders = [lambda: [induction], lambda: truth_studies(cfg),
                lambda: similarity_studies(cfg), lambda: [classifier_study(cfg)]]
    for build in builders:
        start = time.perf_counter()
        studies = build()
        setup = time.perf_counter() - start
        for study in studies:
            result, job, record = score(study, cfg)
            record["setup_seconds"] = round(setup / len(studies), 1)
            records.append(record)
            summary = result.summary()
            board.append(summary.assign(model=study.name))
            curves.append(result.curves().assign(model=study.name))
            if study.name == "induction":
                truth.append(copy_top1(job, study, copy_sources))
            print(f"{study.name}: {record['seconds']} s", flush=True)  # a long run's progress
    first = ["model"]

    def ordered(frames: list[pd.DataFrame]) -> pd.DataFrame:
        frame = pd.concat(frames, ignore_index=True)
        return frame[first + [c for c in frame.columns if c not in first]]

    return {"leaderboard": ordered(board), "curves": ordered(curves),
            "truth": pd.concat(truth, ignore_index=True), "models": pd.DataFrame(records),
            "induction_prompts": pd.DataFrame({"text": induction.texts,
                                               "copy_source": copy_sources})}


def plot(tables: dict[str, pd.DataFrame], path: Path) -> list[Path]:
    """``leaderboard.md`` (the README tables) and ``leaderboard.png`` (AOPC comprehensiveness
    per source and model, with the intervals)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = [path / "leaderboard.md"]
    written[0].write_text(leaderboard_md(tables), encoding="utf-8")
    board = tables["leaderboard"]
    names = list(dict.fromkeys(board["model"]))
    fig, axes = plt.subplots(1, len(names), squeeze=False, figsize=(3.4 * len(names), 4.2))
    for ax, name in zip(axes[0], names, strict=True):
        part = board[board["model"] == name].iloc[::-1]
        mean = part["aopc_comprehensiveness"].to_numpy()
        err = np.stack([mean - part["aopc_comprehensiveness_low"].to_numpy(),
                        part["aopc_comprehensiveness_high"].to_numpy() - mean])
        colours = ["tab:blue" if k == "attention" else "grey" if k == "random"
                   else "tab:orange" for k in part["source_kind"]]
        ax.barh(part["source"], mean, xerr=err, color=colours, capsize=2)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("AOPC comprehensiveness", fontsize=8)
    fig.tight_layout()
    written.append(path / "leaderboard.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> None:
    analysis_main("faithfulness_study", __doc__, Config, run, plot, argv,
                  show=["models", "truth", "leaderboard"])


if __name__ == "__main__":
    main()
