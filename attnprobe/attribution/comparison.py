"""Do the attention weights agree with what the gradients say matters?

:func:`compare` computes, for every text, importance from the attention (raw rows, rollout,
flow, attention × gradient, norms; per layer) and from attribution methods (Integrated
Gradients, saliency, input × gradient, GradientSHAP, leave-one-out ...) for one explicit
target, then scores every (attention view, method) pair and every pair of methods with rank
and distribution agreement metrics — and, when the decisive tokens are known, every source
against that ground truth. Everything comes back as tidy tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from attnprobe.errors import InputError
from attnprobe.extraction import check_texts
from attnprobe.types import TokenAttribution

DEFAULT_METHODS = ("integrated_gradients", "saliency", "input_x_gradient", "leave_one_out")
DEFAULT_VIEWS = ("raw", "rollout", "attn_x_grad", "norm")
# Tidy columns of Comparison.table and Comparison.truth_table.
AGREEMENT_COLUMNS = ("example_id", "source", "source_kind", "view", "layer", "method", "metric",
                     "value", "p_value")
TRUTH_COLUMNS = ("example_id", "source", "source_kind", "view", "layer", "metric", "value")
SIGNIFICANCE = 0.05


def _split(source: str) -> tuple[str, int | None]:
    """``rollout@L3`` -> ("rollout", 3); ``saliency`` -> ("saliency", None)."""
    view, _, layer = source.partition("@L")
    return view, int(layer) if layer else None


@dataclass
class Comparison:
    """Everything :func:`compare` measured.

    Attributes:
        table: agreement per example, ``AGREEMENT_COLUMNS``: ``source`` is an attention view
            (``source_kind="attention"``, e.g. ``rollout@L3``) or a method
            (``"attribution"``), ``method`` the attribution it is compared with.
        truth_table: per example and source, scores against the known decisive tokens
            (``TRUTH_COLUMNS``; empty without ``truth``).
        attributions: every importance vector that went into the tables.
    """

    table: pd.DataFrame
    truth_table: pd.DataFrame
    attributions: list[TokenAttribution] = field(default_factory=list)

    def summary(self) -> pd.DataFrame:
        """Mean ± std over examples, and the share with ``p <= 0.05`` (rank metrics), per
        (source, method, metric); sorted so layers read in order."""
        return _summarise(self.table, ["source_kind", "view", "layer", "source", "method",
                                       "metric"])

    def truth_summary(self) -> pd.DataFrame:
        """Mean ± std over examples of each source's ground-truth scores."""
        if self.truth_table.empty:
            raise InputError("no ground truth was given (compare(..., truth=...))")
        return _summarise(self.truth_table, ["source_kind", "view", "layer", "source", "metric"])


def _summarise(table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    frame = table.copy()
    frame["layer"] = frame["layer"].astype("Int64")
    grouped = frame.groupby(keys, dropna=False, sort=False)
    out = grouped["value"].agg(["mean", "std", "count"]).reset_index()
    out = out.rename(columns={"count": "n"})
    if "p_value" in frame:
        significant = (frame["p_value"] <= SIGNIFICANCE).where(frame["p_value"].notna())
        frac = significant.groupby([frame[k] for k in keys], dropna=False, sort=False).mean()
        out["frac_significant"] = frac.to_numpy()
    return out.sort_values(keys, kind="stable", na_position="first").reset_index(drop=True)


def _special_tokens(tokenizer: Any) -> set[str]:
    """Special tokens left out of the metrics; the unk token is not one of them (it stands for
    a real word, and the attribution methods score it as one)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    ids = [i for i in (getattr(tokenizer, "all_special_ids", []) or []) if i != unk]
    tokens = tokenizer.convert_ids_to_tokens(ids) if ids else []
    return set(tokens if isinstance(tokens, list) else [tokens])


def _fixed(target: Any, spec: str, model: nn.Module, tokenizer: Any) -> Any:
    """The target the attention views explain for one text: the one the methods fixed there
    (``next-token`` -> ``next-token:ID``), so attention × gradient follows the same token and
    names it; ready targets as they are."""
    from attnprobe.attribution.targets import parse_target

    if target.ready:
        return target
    try:
        return parse_target(spec, model, tokenizer)
    except InputError:  # a custom target whose fixed spec is no parseable spec
        return target


def _truth_mask(truth: Sequence[bool] | torch.Tensor, tokens: tuple[str, ...],
                keep: torch.Tensor, example: str) -> torch.Tensor:
    """Truth over every token, from a mask over every token or over the kept ones."""
    truth = torch.as_tensor(truth, dtype=torch.bool).flatten()
    if len(truth) == len(tokens):
        return truth
    if len(truth) == int(keep.sum()):
        full = torch.zeros(len(tokens), dtype=torch.bool)
        full[keep] = truth
        return full
    raise InputError(f"example {example}: truth has {len(truth)} entries but the text has "
                     f"{len(tokens)} tokens ({int(keep.sum())} without special tokens)")


def _rows(example: str, source: TokenAttribution, kind: str, reference: TokenAttribution,
          keep: torch.Tensor, k: int | None) -> list[tuple]:
    from attnprobe.attribution.metrics import agreement

    view, layer = _split(source.method)
    scores = agreement(source, reference, k=k, keep=keep)
    return [(example, source.method, kind, view, layer, reference.method, metric, value, p)
            for metric, (value, p) in scores.items()]


def compare(model: nn.Module, tokenizer: Any, texts: Sequence[str] | str, target: Any, *,
            methods: Sequence[str] = DEFAULT_METHODS, views: Sequence[str] = DEFAULT_VIEWS,
            layers: Sequence[int] | None = None, query: str | int = "cls",
            truth: Sequence[Sequence[bool]] | None = None, k: int | None = None,
            drop_special: bool = True, n_steps: int = 50, batch_size: int = 8,
            progress: bool = False) -> Comparison:
    """Compare attention-derived importance with attribution methods, text by text.

    Args:
        texts: the inputs (one example each).
        target: what is explained — a spec such as ``"class:1"``, ``"next-token"``,
            ``"similarity:A cat sits."`` (see :mod:`attnprobe.attribution.targets`), or a
            callable ``(output, inputs) -> Tensor[batch]``.
        methods: attribution methods (:data:`attnprobe.attribution.methods.METHODS`).
        views: attention views (``raw``, ``rollout``, ``flow``, ``attn_x_grad``, ``norm``),
            computed for every layer in ``layers`` (default: all).
        query: which row the views read (``"cls"``, ``"last"``, ``"mean"``, ``"max"``, int).
        truth: per text, which tokens decide the output (over all tokens, or over the
            non-special ones); adds precision@k, mass and AUROC per source.
        k: top-k size for the overlap metric (default 20 % of the compared tokens).
        drop_special: leave special tokens ([CLS], [SEP], BOS ...) out of every metric
            (``[UNK]`` stays in: it stands for a word of the text).

    Attribution scores are compared by magnitude (``|score|``, as Jain & Wallace and Abnar &
    Zuidema do); :attr:`Comparison.attributions` holds those magnitudes. For signed scores
    call :func:`attnprobe.attribution.methods.attribute` directly.

    Returns:
        A :class:`Comparison` (``.table``, ``.summary()``, ``.truth_table``,
        ``.truth_summary()``).
    """
    from attnprobe.attribution.methods import attribute
    from attnprobe.attribution.metrics import truth_scores
    from attnprobe.attribution.targets import parse_target
    from attnprobe.attribution.views import attention_importance

    texts = check_texts(texts)
    if truth is not None and len(truth) != len(texts):
        raise InputError(f"truth has {len(truth)} entries for {len(texts)} texts")
    if not methods:
        raise InputError("give at least one attribution method to compare with")
    target = parse_target(target, model, tokenizer)
    special = _special_tokens(tokenizer) if drop_special else set()
    attributions = attribute(model, tokenizer, texts, target, methods, n_steps=n_steps,
                             batch_size=batch_size)
    # importance is the magnitude: a token that pushes the output down matters too
    # (Jain & Wallace sum |gradient|; Abnar & Zuidema take |Σ_d ∂y/∂e|)
    attributions = [TokenAttribution(a.scores.abs(), a.tokens, a.method, a.target,
                                     a.example_id, a.delta) for a in attributions]
    by_example: dict[str, list[TokenAttribution]] = {}
    for item in attributions:
        by_example.setdefault(item.example_id, []).append(item)
    agreement_rows: list[tuple] = []
    truth_rows: list[tuple] = []
    kept: list[TokenAttribution] = list(attributions)
    indices = range(len(texts))
    if progress:
        from attnprobe._optional import require

        indices = require("tqdm").tqdm(indices, desc="compare", unit="text")
    for i in indices:
        example = str(i)
        found = by_example.get(example, [])
        fixed = _fixed(target, found[0].target, model, tokenizer)
        seen = attention_importance(model, tokenizer, texts[i], fixed, views=views,
                                    layers=layers, query=query) if views else []
        seen = [TokenAttribution(v.scores, v.tokens, v.method, v.target, example)
                for v in seen]
        kept.extend(seen)
        tokens = found[0].tokens
        if any(v.tokens != tokens for v in seen):
            raise InputError(f"example {example}: the attention views and the attributions "
                             "tokenised the text differently")
        keep = torch.tensor([t not in special for t in tokens])
        if int(keep.sum()) < 2:
            raise InputError(f"example {example}: fewer than two tokens to compare")
        for view in seen:
            for reference in found:
                agreement_rows += _rows(example, view, "attention", reference, keep, k)
        for a, first in enumerate(found):
            for reference in found[a + 1:]:
                agreement_rows += _rows(example, first, "attribution", reference, keep, k)
        if truth is not None:
            mask = _truth_mask(truth[i], tokens, keep, example)
            for source, kind in [*((v, "attention") for v in seen),
                                 *((m, "attribution") for m in found)]:
                view, layer = _split(source.method)
                for metric, value in truth_scores(source.scores[keep], mask[keep]).items():
                    truth_rows.append((example, source.method, kind, view, layer, metric,
                                       value))
    table = pd.DataFrame(agreement_rows, columns=list(AGREEMENT_COLUMNS))
    truth_table = pd.DataFrame(truth_rows, columns=list(TRUTH_COLUMNS))
    for frame in (table, truth_table):  # model layer index; <NA> for methods and attn_x_grad
        frame["layer"] = frame["layer"].astype("Int64")
    return Comparison(table, truth_table, kept)
