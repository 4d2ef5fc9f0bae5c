"""Attribution patching (``experiment="attribution"``; :func:`attnprobe.patch.attribution`) and
its agreement with real activation patching (:func:`agreement`).

Follows [causal methods](../guide/causal-methods.md#attribution-patching) (Nanda 2023,
"Attribution patching"; Syed et al. 2023): the change a patch of activation ``a`` makes to the
metric, to first order at the base run, is ``m_patched − m_base ≈ Σ (a_other − a_base) · ∂m/∂a``
— evaluated at the corrupted run when
denoising, at the clean run when noising. The sum runs over the head's ``d_head`` features
(over the keys for ``pattern``) and, with ``positions="all"``, over the positions; one forward
per input and **one backward** give every head (× position) at once. ``patched`` is the base
metric plus that estimate, normalised like activation patching (:mod:`attnprobe.patch.table`).
Known to be weak where attention saturates (a softmax far from linear): :func:`agreement`
says how well it ranks heads against a real :func:`attnprobe.patch.heads` table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from attnprobe.core.autograd import gradients_reach
from attnprobe.core.display import describe
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError
from attnprobe.inputs.text import batch_spans
from attnprobe.patch.activation import SiteParams, axis_sizes
from attnprobe.patch.job import Job, register_experiment
from attnprobe.patch.sites import site_spec
from attnprobe.patch.table import Row, check_differs, summary, tidy
from attnprobe.patch.units import axis_heads

__all__ = ["Agreement", "AttributionParams", "agreement", "patch_attribution"]

RANK = 30  # after path patching

JOIN = ("example_id", "layer", "head", "position", "site", "direction", "metric")


@dataclass(frozen=True)
class AttributionParams(SiteParams):
    """The options of ``heads`` but ``per`` (the estimate is per head)."""

    estimates = "heads"


def _per_position(product: torch.Tensor) -> torch.Tensor:
    """``[batch, head, position, ...]`` summed over the features (or keys): ``[batch, head,
    position]``."""
    return product.flatten(3).sum(-1) if product.ndim > 3 else product


@register_experiment("attribution", AttributionParams, summary=(
    "attribution patching: the gradient estimate of heads for every head (x position) from "
    "two forwards and one backward"))
def patch_attribution(job: Job) -> pd.DataFrame:
    params: AttributionParams = job.params  # type: ignore[assignment]
    spec = site_spec(params.site)
    sizes = axis_sizes(job, job.scope, params.site)
    heads = {layer: axis_heads(job.scope, layer, *sizes[layer]) for layer in sorted(sizes)}
    heads = {layer: h for layer, h in heads.items() if h and job.scope.wants_layer(layer)}
    scope = Scope(layers=tuple(heads))

    def one(span: slice) -> tuple[np.ndarray, np.ndarray, list[Row]]:
        values, scores = _estimates(job, span, scope, spec.tensor, heads)
        rows = _span_rows(job, span, heads, scores, values[job.base].numpy(),
                          params.positions)
        return values["clean"].numpy(), values["corrupt"].numpy(), rows

    parts = job.sharded(one, batch_spans(len(job.pairs), job.batch_size),
                        desc=f"patch attribution: {params.site}")
    clean = np.concatenate([p[0] for p in parts])
    corrupt = np.concatenate([p[1] for p in parts])
    note = check_differs(clean, corrupt, job.pairs.ids, job.plan.name)
    rows = sorted((r for p in parts for r in p[2]),
                  key=lambda r: (r.layer, r.head, r.position or 0, r.example))
    return tidy("attribution", rows, ids=job.pairs.ids, clean=clean, corrupt=corrupt,
                site=params.site, direction=job.direction, metric=job.plan.name, note=note)


def _estimates(job: Job, span: slice, scope: Scope, tensor: str,
               heads: dict[int, tuple[int, ...]]
               ) -> tuple[dict[str, torch.Tensor], dict[int, np.ndarray]]:
    """The metric of both runs of ``span`` per run name ``[b]``, and per layer the estimate
    ``Σ (a_other − a_base) · ∂m/∂a`` of each of its ``heads`` ``[b, head, position]``
    (module docstring): one forward per run, one backward."""
    clean, corrupt = job.pairs.encoded(job.model, job.tokenizer, span)
    inputs = {"clean": clean, "corrupt": corrupt}
    metric = job.plan.build(job.pairs.index[span], clean["input_ids"].shape[1])
    other_output, other = job.read(inputs[job.other], scope, (tensor,))
    if job.other == "clean":
        metric = metric.fixed(other_output, clean)
    # the metric too is computed with gradients, also when the caller is under no_grad
    with gradients_reach(job.model):
        output, base = job.read(inputs[job.base], scope, (tensor,), grad=True)
        if job.base == "clean":
            metric = metric.fixed(output, clean)
        m = metric(output, inputs[job.base])
        acts = [base[tensor][layer] for layer in heads]
        if not m.requires_grad or not all(a.requires_grad for a in acts):
            raise InputError(f"metric {job.plan.name!r} does not depend on the patched "
                             "activations through the autograd graph (a callable metric "
                             "that detaches?); attribution patching needs its gradient")
        grads = torch.autograd.grad(m.sum(), acts, allow_unused=True)
    # read after the metric was fixed on the clean run: both runs score the clean answer
    values = {job.other: job.plan.values(metric, other_output, inputs[job.other]),
              job.base: job.plan.values(metric, output, inputs[job.base])}
    scores: dict[int, np.ndarray] = {}
    for layer, act, grad in zip(heads, acts, grads, strict=True):
        if grad is None:
            grad = torch.zeros_like(act)
        delta = other[tensor][layer].to(act.dtype) - act.detach()
        score = _per_position((delta * grad).float())  # [batch, head, position]
        index = torch.tensor(heads[layer], device=score.device)
        scores[layer] = score.index_select(1, index).double().cpu().numpy()
    return values, scores


def _span_rows(job: Job, span: slice, heads: dict[int, tuple[int, ...]],
               scores: dict[int, np.ndarray], base_values: np.ndarray,
               positions: str) -> list[Row]:
    """The rows of ``span``: the base metric ``[b]`` plus each head's estimate, summed over
    the positions (``positions="all"``) or at each position of its example."""
    rows = []
    for layer, score in scores.items():
        for t in range(score.shape[0]):
            i = span.start + t
            for j, head in enumerate(heads[layer]):
                if positions == "all":
                    estimate = base_values[t] + score[t, j].sum()
                    rows.append(Row(i, layer, head, None, float(estimate)))
                    continue
                for p in range(job.pairs.lengths[i]):
                    rows.append(Row(i, layer, head, p, float(base_values[t] + score[t, j, p])))
    return rows


# ----------------------------------------------------------------------------- agreement
@dataclass(frozen=True)
class Agreement:
    """Attribution patching next to real activation patching.

    ``table``: one row per head (``level="head"``: the mean effect over examples) or per
    example and head (``"row"``), with ``effect_attribution`` and ``effect_patching``;
    ``pearson`` / ``spearman``: their correlation over those rows (NaN when fewer than two
    rows vary); ``n``: how many rows it is over.
    """

    table: pd.DataFrame
    pearson: float
    spearman: float
    n: int
    level: str

    def __repr__(self) -> str:
        what = "heads" if self.level == "head" else "rows"
        return describe("Agreement", "attribution vs activation patching",
                        f"pearson {self.pearson:.3g}", f"spearman {self.spearman:.3g}",
                        f"over {self.n} {what}")


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 2 or np.std(x) == 0 or np.std(y) == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


def _only(table: pd.DataFrame, experiment: str, what: str) -> pd.DataFrame:
    if not isinstance(table, pd.DataFrame) or not set(JOIN) | {"effect"} <= set(table.columns):
        raise InputError(f"{what} must be a patching table (from ap.patch.{experiment})")
    if "experiment" in table.columns and set(table["experiment"]) != {experiment}:
        raise InputError(f"{what} must come from ap.patch.{experiment}; it holds "
                         f"{sorted(set(table['experiment']))}")
    return table


def agreement(attribution: pd.DataFrame, patching: pd.DataFrame, *,
              level: str = "head") -> Agreement:
    """Join an :func:`attnprobe.patch.attribution` table with an :func:`attnprobe.patch.heads`
    table of the same pairs, site, direction and metric, and correlate their effects
    (Pearson, and Spearman: Pearson of the ranks).

    Args:
        level: ``"head"`` (the mean effect over examples per head and position: how the two
            rank heads) or ``"row"`` (every example and head).

    Raises:
        InputError: tables of other experiments, or nothing in common to join.

    Example:
        >>> model, tok = ap.load_model("ref:induction")
        >>> clean = ["t05 t11 t40 t03 t17 t42 t08 t55 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> corrupt = ["t60 t61 t62 t63 t01 t02 t04 t06 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> copies = list(range(9, 16))  # second-copy positions ([BOS] is position 0)
        >>> options = dict(scope="layer:1", metric_positions=copies)
        >>> found = ap.patch.agreement(
        ...     ap.patch.attribution(model, tok, clean, corrupt, "logit:next", **options),
        ...     ap.patch.heads(model, tok, clean, corrupt, "logit:next", **options))
        >>> found.pearson, found.table
    """
    attribution = _only(attribution, "attribution", "attribution")
    patching = _only(patching, "heads", "patching")
    if level not in ("head", "row"):
        raise InputError(f"unknown level {level!r}; choose 'head' or 'row'")
    if level == "head":
        keys = ["layer", "head", "position", "site", "direction", "metric"]
        left, right = summary(attribution), summary(patching)
    else:
        keys, left, right = list(JOIN), attribution, patching
    joined = left[[*keys, "effect"]].merge(
        right[[*keys, "effect"]], on=keys, suffixes=("_attribution", "_patching"))
    if joined.empty:
        raise InputError("the attribution and patching tables share no (head, position, site, "
                         "direction, metric); run both on the same pairs and options")
    both = joined[["effect_attribution", "effect_patching"]].to_numpy(float)
    finite = np.isfinite(both).all(1)
    x, y = both[finite, 0], both[finite, 1]
    ranks = pd.DataFrame({"x": x, "y": y}).rank().to_numpy(float)
    return Agreement(joined, _pearson(x, y), _pearson(ranks[:, 0], ranks[:, 1]) if len(x)
                     else math.nan, int(finite.sum()), level)
