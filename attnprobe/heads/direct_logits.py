"""Direct logit attribution per head: how much each head writes straight into a metric.

Follows the definition in
[causal methods](../guide/causal-methods.md#direct-logit-attribution) (Elhage et al. 2021;
TransformerLens ``decompose_resid``, ``stack_head_results``, ``apply_ln_to_stack``). In a
pre-norm model the final residual is a sum of components,

``resid = embed + Σ_layers (Σ_heads z_h @ W_O[h] + b_O + mlp)``,

and the logits are ``final_norm(resid) @ W_U + b_U``. With the final norm's scale ``s`` frozen
at the value the run computed on the full residual (LayerNorm: centre each component and
divide by the run's σ; RMSNorm: divide by the run's RMS; then multiply by the norm's weight),
each component ``c`` contributes ``(C(c) / s ⊙ w) · W_U[:, t]`` to the logit of token ``t``,
and the norm's bias (``b · W_U[:, t]``) and the unembedding's bias (``b_U[t]``) are rows of
their own, so **the components sum to the logit exactly**. A head's value bias ``b_V[h] @
W_O[h]`` counts in the head (``value_bias="head"``, the default) or in the layer's
``attn_bias`` row (``"output"``, TransformerLens' default; :data:`VALUE_BIASES`).

The metric must be linear in the logits (:meth:`attnprobe.core.metric.Metric.logit_terms`:
``logit:T``, ``logit_diff:A,B``, ``next-token``, ``logit:next``); each row's ``value`` carries
the metric's coefficient, so over positions and components an example's rows sum to its
metric (a mean over several positions). This is checked on every batch against the metric
read off the model's real logits: a gap above :func:`tolerance` (and, in half precision,
above the model's own rounding: :func:`~attnprobe.heads.residual_parts.rounding_bound`) is a
one-line :class:`~attnprobe.weights.anatomy.DecompositionError`, never a silently wrong
table.

One forward per batch: forward hooks (:mod:`attnprobe.heads.residual_parts`; removed on
exit, also on error) read the input of the first block (the embeddings: token, position, any
scaling), the input of each attention output projection (the heads' outputs ``z``, split per
head and multiplied by that head's slice of ``W_O``), each MLP output, and the final norm's
input and output (its scale is read off the two). Only the positions the metric reads are
kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from attnprobe.core import html_view
from attnprobe.core.checks import check_eval
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.display import counted, describe, grid
from attnprobe.core.distributed import run_sharded
from attnprobe.core.metric import Metric, Positions, positions_mask
from attnprobe.core.registry import one_of
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError
from attnprobe.heads.logit_inputs import (
    DEFAULT_POSITIONS,
    MetricRequest,
    Pair,
    metric_request,
    renamed_positions,
)
from attnprobe.heads.residual_parts import (
    VALUE_BIASES,
    Component,
    OutputWeights,
    ValueBias,
    check_residual,
    contributions,
    recording,
    rounding_bound,
    rounding_size,
    tolerance,
)
from attnprobe.inputs.prepared import PreparedCorpus, prepare
from attnprobe.inputs.text import Text, Truncation, batch_spans, model_inputs
from attnprobe.weights.anatomy import Anatomy, DecompositionError, anatomy

__all__ = ["COLUMNS", "KINDS", "TOTAL_COLUMNS", "LogitAttribution", "component_means",
           "head_means", "logit_attribution", "tolerance"]

COLUMNS = ["example_id", "position", "component", "kind", "layer", "head", "metric", "value"]
TOTAL_COLUMNS = ["example_id", "metric", "value", "components", "gap"]
KINDS = ("embed", "head", "rest", "bias", "mlp")
"""``embed`` (the residual entering layer 0), ``head`` (one head), ``rest`` (a layer's heads
outside ``scope``, summed), ``bias`` (an output projection's, the final norm's and the
unembedding's biases), ``mlp`` (one layer's MLP output)."""


@dataclass(frozen=True, eq=False)
class LogitAttribution:
    """Direct logit attribution of a corpus (module docstring).

    Attributes:
        table: one row per example, measured position and component (:data:`COLUMNS`):
            ``position`` counts real tokens from 0, ``kind`` one of :data:`KINDS`, ``layer``
            / ``head`` integers or NA, ``value`` the component's part of the metric.
        totals: one row per example (:data:`TOTAL_COLUMNS`): the model's own ``value`` of
            the metric, the ``components``' sum and their ``gap``.
        model / family: the model's name and its anatomy family.
        n_layers / n_heads: the model's grid.
        value_bias: where each head's value bias was counted (:data:`VALUE_BIASES`).
    """

    table: pd.DataFrame
    totals: pd.DataFrame
    model: str
    family: str
    n_layers: int
    n_heads: int
    value_bias: ValueBias = "head"

    def by_component(self) -> pd.DataFrame:
        """Each component's mean part of an example's metric (:func:`component_means`)."""
        return component_means(self.table)

    def by_head(self) -> pd.DataFrame:
        """Layer × head: each head's mean part of an example's metric (:func:`head_means`)."""
        return head_means(self.table, self.n_layers, self.n_heads)

    def _repr_html_(self) -> str | None:
        """Heads as a layer × head heatmap, the components and the table (collapsed)."""
        return html_view.html(self, "logit_attribution")

    def __repr__(self) -> str:
        specs = list(dict.fromkeys(self.totals["metric"].astype(str)))
        metric = specs[0] if len(specs) == 1 else f"{specs[0]} +{len(specs) - 1} more"
        gap = float(self.totals["gap"].abs().max()) if len(self.totals) else 0.0
        return describe("LogitAttribution", self.model, metric,
                        counted(len(self.totals), "example"),
                        counted(len(self.table[["example_id", "position"]].drop_duplicates()),
                                "position"),
                        grid(self.n_layers, self.n_heads), f"max gap {gap:.1e}")


def component_means(table: pd.DataFrame) -> pd.DataFrame:
    """Each component's mean over examples of its part of the example's metric (its
    positions summed), in model order: ``component, kind, layer, head, value``."""
    keys = ["component", "kind", "layer", "head"]
    per = table.groupby(["example_id", *keys], sort=False, dropna=False)["value"].sum()
    return per.groupby(keys, sort=False, dropna=False).mean().reset_index()


def head_means(table: pd.DataFrame, n_layers: int | None = None,
               n_heads: int | None = None) -> pd.DataFrame:
    """Layer × head (``n_layers`` × ``n_heads`` when given) of :func:`component_means` of
    the ``head`` rows; heads without a row (outside the scope) are NaN."""
    means = component_means(table)
    heads = means[means["kind"] == "head"].astype({"layer": int, "head": int})
    frame = heads.pivot(index="layer", columns="head", values="value")
    layers = range(n_layers) if n_layers is not None else frame.index
    columns = range(n_heads) if n_heads is not None else frame.columns
    return frame.reindex(index=layers, columns=columns)


# ----------------------------------------------------------------------------- recording
def _check_metric(totals: pd.DataFrame, model: Anatomy, dtype: torch.dtype) -> None:
    """The components of every example sum to the metric the model's logits give: within
    :func:`~attnprobe.heads.residual_parts.tolerance` of their summed magnitude, or within
    the model's own rounding in ``dtype`` (``rounding``: :func:`~attnprobe.heads.
    residual_parts.rounding_bound` times the example's rounding size)."""
    scale = np.maximum(totals["size"].to_numpy(), totals["value"].abs().to_numpy())
    allowed = np.maximum(tolerance(dtype) * np.maximum(scale, 1e-12),
                         totals["rounding"].to_numpy())
    excess = totals["gap"].abs().to_numpy() / allowed
    worst = int(np.argmax(excess)) if len(excess) else 0
    if len(excess) and excess[worst] > 1:
        row = totals.iloc[worst]
        raise DecompositionError(
            f"example {row['example_id']}: the components sum to {row['components']:.6g} but "
            f"the model's {row['metric']} is {row['value']:.6g} (gap {row['gap']:.3g} > "
            f"{allowed[worst]:.3g}, the most {dtype} rounding allows); the {model.family} "
            f"adapter does not see everything this model computes")


# ----------------------------------------------------------------------------- one batch
def _kept(metric: Metric, positions: Positions | None,
          batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[batch, seq]`` bool: the positions to record (those the metric reads; every real
    one for a metric given as an object that is still to be fixed)."""
    if metric.ready:
        terms = metric.logit_terms(batch)
        keep = torch.zeros_like(batch["input_ids"], dtype=torch.bool)
        keep[terms.example, terms.position] = True
        return keep
    if positions is not None:
        return positions_mask(positions, batch)
    return batch["attention_mask"].bool()


@dataclass(frozen=True)
class _Job:
    """Everything one batch needs (so ranks of a process group can share it)."""

    model: nn.Module
    tokenizer: Any
    prepared: PreparedCorpus
    ids: tuple[str, ...]
    request: MetricRequest
    scope: Scope
    anatomy: Anatomy
    weights: OutputWeights
    max_length: int | None
    truncation: Truncation
    value_bias: ValueBias

    def __call__(self, span: slice) -> tuple[pd.DataFrame, pd.DataFrame]:
        rows = [int(i) for i in self.ids[span]]  # this batch's part of the corpus's options
        batch = self.prepared.inputs(rows, max_length=self.max_length,
                                     truncation=self.truncation)
        metric, positions = self.request.for_batch(rows, batch["input_ids"].shape[1])
        keep = _kept(metric, positions, batch)
        param = next(self.model.parameters())
        dtype = torch.float32 if param.device.type == "mps" else torch.float64
        with torch.no_grad():
            with recording(self.anatomy, keep, dtype) as record:
                output = self.model(**model_inputs(self.model, batch))
            fixed = metric.fixed(output, batch)
            real = fixed(output, batch).detach().double().cpu()
            terms = fixed.logit_terms(batch)
            row_of = torch.full(keep.shape, -1, dtype=torch.long)
            row_of[keep] = torch.arange(int(keep.sum()))
            rows = row_of[terms.example, terms.position]
            if bool((rows < 0).any()):
                raise DecompositionError("the metric reads a position that was not recorded")
            magnitude = check_residual(self.anatomy, self.weights, record)
            columns = contributions(self.anatomy, self.weights, record, self.scope, rows,
                                    terms.token, terms.coeff, value_bias=self.value_bias)
            rounding = rounding_size(self.anatomy, self.weights, record, magnitude, rows,
                                     terms.token, terms.coeff).cpu()  # [terms]
        values = torch.stack([c for _, c in columns], -1).cpu()  # [terms, component]
        rounding = rounding * rounding_bound(self.anatomy, record.source_dtype)
        return self._frames(batch, fixed.spec, real, terms.example, terms.position, values,
                            [c for c, _ in columns], span, record.source_dtype, rounding)

    def _frames(self, batch: dict[str, torch.Tensor], spec: str, real: torch.Tensor,
                example: torch.Tensor, slot: torch.Tensor, values: torch.Tensor,
                components: list[Component], span: slice, dtype: torch.dtype,
                rounding: torch.Tensor) -> tuple[pd.DataFrame, pd.DataFrame]:
        seq = batch["input_ids"].shape[1]
        pair, inverse = torch.unique(example * seq + slot, return_inverse=True)
        summed = torch.zeros(len(pair), values.shape[1], dtype=values.dtype)
        summed.index_add_(0, inverse, values)  # [pairs, component]: a metric's terms per slot
        b, s = (pair // seq), (pair % seq)
        order = batch["attention_mask"].long().cumsum(-1) - 1  # slot -> real position
        ids = np.asarray(self.ids[span], dtype=object)
        n_c = len(components)
        table = pd.DataFrame({
            "example_id": np.repeat(ids[b.numpy()], n_c),
            "position": np.repeat(order[b, s].numpy(), n_c),
            "component": np.tile([c.name for c in components], len(pair)),
            "kind": np.tile([c.kind for c in components], len(pair)),
            "layer": pd.array(np.tile([c.layer for c in components], len(pair)), "Int64"),
            "head": pd.array(np.tile([c.head for c in components], len(pair)), "Int64"),
            "metric": spec,
            "value": summed.reshape(-1).numpy(),
        })
        per_example = torch.zeros(len(ids), dtype=values.dtype).index_add_(
            0, example, values.sum(-1))
        size = torch.zeros(len(ids), dtype=values.dtype).index_add_(
            0, example, values.abs().sum(-1))
        bound = torch.zeros(len(ids), dtype=values.dtype).index_add_(
            0, example, rounding.to(values.dtype))  # the model's own rounding, per example
        totals = pd.DataFrame({"example_id": ids, "metric": spec, "value": real.numpy(),
                               "components": per_example.numpy(),
                               "gap": (per_example - real).numpy(), "size": size.numpy(),
                               "rounding": bound.numpy()})
        _check_metric(totals, self.anatomy, dtype)
        return table, totals[TOTAL_COLUMNS]


# ----------------------------------------------------------------------------- entry point
def logit_attribution(model: nn.Module, tokenizer: Any, texts: Sequence[Text] | Any,
                      metric: str | Metric, *,
                      metric_positions: Positions | None = DEFAULT_POSITIONS,
                      pairs: Sequence[Pair] | None = None, value_bias: ValueBias = "head",
                      positions: Positions | None = None, corpus: CorpusOptions | None = None,
                      **keywords: Any) -> LogitAttribution:
    """Direct logit attribution of ``metric`` to every head, the embeddings, each MLP and
    the biases, over ``texts`` (module docstring; the definition:
    [causal methods](../guide/causal-methods.md#direct-logit-attribution)).

    Args:
        model: a pre-norm language model whose layout attnprobe knows
            (:mod:`attnprobe.weights.anatomy`: GPT-2, LLaMA-layout decoders, the reference
            models), in eval mode; post-norm (BERT-style) models are refused.
        texts: strings or token ids, as every corpus analysis takes them (or a
            :class:`~attnprobe.inputs.prepared.PreparedCorpus`).
        metric: a spec linear in the logits (``logit:T``, ``logit_diff:A,B``,
            ``next-token``, ``logit:next``; :mod:`attnprobe.core.metric`) or a
            :class:`~attnprobe.core.metric.Metric` (which carries its own positions).
        corpus / keywords: the corpus options (:class:`~attnprobe.core.corpus_options.
            CorpusOptions`, or its fields by name): ``scope``, the heads listed one by one
            (the others of each layer form one ``rest`` row, so the table still sums to the
            metric); ``batch_size``, ``truncation``, ``progress``, ``distributed``,
            ``max_length`` as for every corpus analysis (:func:`attnprobe.extract`);
            ``seed`` is unused (nothing is drawn).
        metric_positions: where a spec reads, as in patching: ``"last"`` (default), ``"all"``,
            a position, a list, one list per text, or a ``[text, seq]`` bool mask exactly as
            wide as the longest text; ``None`` is the metric's default (``"all"`` for
            ``logit:next``, else ``"last"``). Positions count real tokens, negative ones from
            the end (:mod:`attnprobe.core.positions`).
        pairs: for ``metric="logit_diff"``, one ``(correct, wrong)`` pair per text, as in
            patching.
        value_bias: where a head's value bias ``b_V`` goes (:data:`VALUE_BIASES`):
            ``"head"`` (default: each head keeps ``b_V @ W_O``, what it writes) or
            ``"output"`` (TransformerLens' default: heads read ``z`` without ``b_V``, and the
            layer's ``attn_bias`` row gets ``Σ_h b_V[h] @ W_O[h]``). Totals are the same.
        positions: deprecated name of ``metric_positions`` (a ``DeprecationWarning``).

    Returns:
        :class:`LogitAttribution`: ``.table`` (:data:`COLUMNS`), ``.totals`` (the model's
        metric next to the components' sum), ``.by_head()``, ``.by_component()``.

    Raises:
        InputError: a refused or unknown model, a model in training mode, a model without an
            unembedding, a metric that is not linear in the logits, bad positions (the
            argument, example and position named), pairs or texts.
        DecompositionError: the components do not add up to the model's metric (more than
            :func:`tolerance` relative, and more than a half-precision model's own rounding,
            :func:`~attnprobe.heads.residual_parts.rounding_bound`: ``(3·L + 5)·u`` of the
            terms' rounding size, ``u = 2⁻⁸`` in bf16): the model computes something its
            adapter misses. The components themselves are float64 (float32 on MPS) products
            of the activations the model computed, in whatever dtype it ran.

    Example:
        >>> dla = ap.heads.logit_attribution(lm, lm_tok, [prompt], "logit:next",
        ...                                  metric_positions="all")
        >>> dla.by_head().shape    # layer × head: each head's direct part of the metric
        (2, 4)
        >>> t = dla.totals         # the components add up to the model's own metric
        >>> bool(np.allclose(t["components"], t["value"], atol=1e-4))
        True
    """
    walk = CorpusOptions.merged(corpus, keywords, owner="logit_attribution()")
    truncation, max_length = walk.truncation, walk.max_length
    metric_positions = renamed_positions(metric_positions, positions)
    if value_bias not in VALUE_BIASES:
        raise InputError(one_of("value_bias", value_bias, tuple(VALUE_BIASES)))
    parts = anatomy(model)
    check_eval(model)
    scope = Scope.parse(walk.scope).validate(parts.n_layers, parts.n_heads, name=parts.name)
    prepared = prepare(model, tokenizer, texts)
    kept = prepared.corpus(truncation=truncation, max_length=max_length)
    request = metric_request(model, tokenizer, kept, metric, metric_positions, pairs,
                             truncation=truncation, max_length=max_length)
    if not request.parsed.linear:
        raise InputError(f"metric {request.parsed.spec!r} is not a sum of logits; a direct "
                         "logit attribution needs logit:T, logit_diff:A,B, next-token or "
                         "logit:next (prob, logprob and loss are not linear in the logits)")
    weights = OutputWeights.read(parts)
    job = _Job(model, tokenizer, prepared, kept.ids, request, scope, parts, weights,
               max_length, truncation, value_bias)
    found = run_sharded(job, batch_spans(len(kept.texts), walk.batch()),
                        distributed=walk.distributed, progress=walk.progress,
                        desc="logit attribution")
    table = pd.concat([t for t, _ in found], ignore_index=True)
    totals = pd.concat([t for _, t in found], ignore_index=True)
    table.attrs["skipped"] = kept.skipped
    return LogitAttribution(table, totals, parts.name, parts.family, parts.n_layers,
                            parts.n_heads, value_bias)
