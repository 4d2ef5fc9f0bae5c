"""Head importance and the pruning curve (Michel, Levy & Neubig 2019, "Are Sixteen Heads
Really Better than One?").

Michel et al. give every head a gate ``ξ_h`` on its output, ``MHAtt(x) = Σ_h ξ_h Att_h(x)``,
and score it by ``I_h = E_x |∂L(x)/∂ξ_h|`` at ``ξ = 1``. Because the head's output is
``A_h V_h``, a gate on the output is the same as a gate on the weights, and at ``ξ = 1``::

    ∂L/∂ξ_h = Σ_{q,k} A_h[q, k] · ∂L/∂A_h[q, k]

so the score needs only the weights and their gradients. Pruning a head sets ``ξ_h = 0``,
i.e. zeroes its weights (its output is then exactly zero).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pandas as pd
import torch
from torch import nn

from attnprobe.capture import Edit, Live, Site, capture
from attnprobe.core.autograd import gradients_reach
from attnprobe.core.distributed import run_sharded
from attnprobe.errors import InputError
from attnprobe.inputs.text import Truncation, batch_spans, check_inputs, encode, model_inputs
from attnprobe.types import head_id

__all__ = ["IMPORTANCE_COLUMNS", "PRUNING_COLUMNS", "curve_points", "head_importance",
           "pruned_outputs", "pruning_curve", "similarity_loss"]

IMPORTANCE_COLUMNS = ("stack", "kind", "layer", "head", "head_id", "importance",
                      "importance_raw")
PRUNING_COLUMNS = ("n_pruned", "share_pruned", "metric")

Inputs = Mapping[str, torch.Tensor]
LossFn = Callable[[Any, Inputs], torch.Tensor]
MetricFn = Callable[[Any, Inputs], Any]


# ----------------------------------------------------------------------------- helpers
def _query_rows(inputs: Inputs, site: Site, batch: int, n_query: int,
                device: torch.device) -> torch.Tensor:
    """``[batch, query]`` bool: the real query rows of a site (padding rows are left out)."""
    name = "decoder_attention_mask" if site.side == "decoder" else "attention_mask"
    mask = inputs.get(name)
    if isinstance(mask, torch.Tensor) and tuple(mask.shape) == (batch, n_query):
        return mask.to(device) != 0
    return torch.ones(batch, n_query, dtype=torch.bool, device=device)


def _check_loss(loss: Any, batch: int) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor) or loss.ndim != 1 or loss.shape[0] != batch:
        got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise InputError(f"loss_fn must return one loss per example, a tensor [{batch}]; "
                         f"got {got}")
    if not torch.isfinite(loss.detach()).all():
        raise InputError("loss_fn returned NaN or inf")
    return loss


def _site_order(site: Site) -> tuple[str, str, int]:
    return (site.stack, site.kind, site.layer)


# ----------------------------------------------------------------------------- importance
def _batch_importance(model: nn.Module, inputs: Inputs, loss_fn: LossFn
                      ) -> dict[Site, torch.Tensor]:
    """Per attention site, ``Σ_x |∂L(x)/∂ξ_h|`` over the examples of one batch: ``[head]``."""
    n = int(next(iter(inputs.values())).shape[0])
    totals: dict[Site, torch.Tensor] = {}
    with gradients_reach(model):
        with capture(model, parts=[Live()]) as cap:
            output = model(**inputs)
        loss = _check_loss(loss_fn(output, inputs), n)
        if len(cap.live) != 1:
            raise InputError(f"the model ran {len(cap.live)} forward calls for one batch; "
                             "head_importance needs exactly one")
        sites = sorted(cap.live[0], key=_site_order)
        patterns = [cap.live[0][s] for s in sites]
        tracked = [i for i, p in enumerate(patterns) if p.requires_grad]
        if not loss.requires_grad or not tracked:
            raise InputError("no gradient reaches the attention from loss_fn (a detached "
                             "loss, or weights computed without autograd)")
        grads = torch.autograd.grad(loss.sum(), [patterns[i] for i in tracked],
                                    allow_unused=True)
    by_index = dict(zip(tracked, grads, strict=True))
    for i, site in enumerate(sites):
        weights = patterns[i].detach().to(torch.float64)  # [batch, head, query, key]
        grad = by_index.get(i)
        if grad is None:  # this head cannot influence the loss
            per_row = torch.zeros(weights.shape[:3], dtype=torch.float64)
        else:
            per_row = (weights * grad.to(torch.float64)).sum(-1)  # [batch, head, query]
        rows = _query_rows(inputs, site, n, weights.shape[2], per_row.device)
        per_head = (per_row * rows[:, None, :]).sum(-1)  # [batch, head] = ∂L_x/∂ξ_h
        totals[site] = per_head.abs().sum(0).cpu()
    return totals


def head_importance(model: nn.Module, tokenizer: Any, texts: Sequence[str] | str,
                    loss_fn: LossFn, *, batch_size: int = 8, truncation: Truncation = "error",
                    max_length: int | None = None, distributed: bool | None = None,
                    progress: bool = False) -> pd.DataFrame:
    """Michel et al.'s head importance ``I_h = E_x |∂L(x)/∂ξ_h|`` of every head.

    How it is computed: one forward per batch under :func:`attnprobe.capture` with
    ``live=True`` keeps every layer's weights ``A`` in the autograd graph, and
    ``torch.autograd.grad`` gives ``∂L/∂A``; per example and head,
    ``∂L/∂ξ_h = Σ_{q,k} A ⊙ ∂L/∂A`` (exact at ``ξ = 1``, see the module docstring), and the
    absolute value is taken per example, as the paper requires. A mask ``ξ`` inserted with
    ``edit=`` would give the same number, but at ``ξ = 1`` such an edit changes nothing, which
    the capture context rightly reports as an edit that was not applied; reading the live
    weights needs no edit and no extra forward. Query rows of padding tokens are left out, so
    a text's score does not depend on its batch. Parameters are never modified (a frozen
    model is made to require grad for the call only; no ``.grad`` is written).

    Args:
        texts: the corpus ``X`` (each non-empty).
        loss_fn: ``loss_fn(output, inputs) -> Tensor[batch]``, one loss per example, e.g. a
            classifier's ``cross_entropy(output, labels, reduction="none")`` or
            :func:`similarity_loss` for an embedding model. ``inputs`` holds ``input_ids``
            and ``attention_mask``; examples must not interact (model in eval mode).
        batch_size: texts per forward (right-padded).
        truncation / max_length: ``"error"`` or ``"cut"`` for texts longer than the model
            allows, or than ``max_length`` tokens.
        distributed: split the batches over the ranks of an initialised ``torch.distributed``
            group (default: when one is initialised); the per-batch sums are exchanged and
            added in batch order on every rank, so the scores equal one process's exactly.
        progress: a progress bar over the batches.

    Returns:
        One row per head, columns ``IMPORTANCE_COLUMNS``: ``stack``/``kind`` name the
        attention stack (one per model except encoder-decoders), ``importance_raw`` is
        ``E_x |∂L/∂ξ_h|`` and ``importance`` is it divided by the ℓ2 norm of its layer's
        raw scores (Michel et al., after Molchanov et al. 2017; 0 where the whole layer is 0).

    Raises:
        InputError: empty texts, a bad ``loss_fn`` result, no gradient reaching the
            attention, or a call inside ``torch.inference_mode()``.

    Example:
        >>> loss = similarity_loss("A cat sits on a rug.", model, tok)   # MiniLM embeds
        >>> table = head_importance(model, tok, texts, loss)
        >>> len(table), list(table.columns) == list(IMPORTANCE_COLUMNS)   # 6 layers × 12
        (72, True)
        >>> squares = table.groupby("layer")["importance"].apply(lambda s: (s ** 2).sum())
        >>> bool(np.allclose(squares, 1.0))             # each layer scaled to unit ℓ2 norm
        True
    """
    texts = check_inputs(texts)  # strings or token ids
    if torch.is_inference_mode_enabled():
        raise InputError("head_importance needs gradients; call it outside "
                         "torch.inference_mode()")

    def one(span: slice) -> dict[Site, torch.Tensor]:
        batch = encode(model, tokenizer, texts[span], truncation=truncation,
                       max_length=max_length)
        return _batch_importance(model, model_inputs(model, batch), loss_fn)

    parts = run_sharded(one, batch_spans(len(texts), batch_size), distributed=distributed,
                        progress=progress, desc="head importance")
    totals: dict[Site, torch.Tensor] = {}
    for part in parts:  # in batch order, as one process adds them
        for site, total in part.items():
            totals[site] = totals[site] + total if site in totals else total
    return _importance_frame(totals, len(texts))


def _importance_frame(totals: dict[Site, torch.Tensor], n_texts: int) -> pd.DataFrame:
    rows = []
    for site in sorted(totals, key=_site_order):
        raw = totals[site] / n_texts
        norm = float(raw.pow(2).sum().sqrt())
        for h, value in enumerate(raw.tolist()):
            rows.append((site.stack, site.kind, site.layer, h, head_id(site.layer, h),
                         value / norm if norm > 0 else 0.0, value))
    return pd.DataFrame(rows, columns=list(IMPORTANCE_COLUMNS))


def similarity_loss(reference_text: str, model: nn.Module, tokenizer: Any) -> LossFn:
    """A loss for embedding models: ``1 - cos(embedding(x), embedding(reference_text))``.

    Embeddings are the attention-masked mean of the last hidden state (the sentence-
    transformers pooling of all-MiniLM-L6-v2). The reference is embedded once, here.

    Returns:
        ``loss_fn(output, inputs) -> Tensor[batch]`` for :func:`head_importance`.

    Example:
        >>> loss = similarity_loss(texts[0], model, tok)   # the first text is the reference
        >>> values = loss(model(**batch), batch)        # [batch]: 1 - cos
        >>> values.shape, bool(values[0].abs() < 1e-5), bool(values[1] > 0)
        (torch.Size([2]), True, True)
    """
    if not isinstance(reference_text, str) or not reference_text.strip():
        raise InputError("similarity_loss needs a non-empty reference text")
    from attnprobe.attribution.targets import parse_target

    target = parse_target(f"similarity:{reference_text}", model, tokenizer)

    def loss(output: Any, inputs: Inputs) -> torch.Tensor:
        return 1.0 - target(output, inputs)

    return loss


# ----------------------------------------------------------------------------- pruning
def _check_order(order: Any) -> tuple[tuple[int, int], ...]:
    def index(x: Any) -> int:
        if isinstance(x, bool):
            raise TypeError
        return operator.index(x)  # ints, numpy ints

    if isinstance(order, pd.DataFrame):
        order = list(zip(order["layer"], order["head"], strict=True))
    try:
        pairs = tuple((index(layer), index(head)) for layer, head in order)
    except (TypeError, ValueError):
        raise InputError("order must be a sequence of (layer, head) pairs of integers") from None
    bad = [p for p in pairs if p[0] < 0 or p[1] < 0]
    if bad:
        raise InputError(f"order must hold non-negative (layer, head) pairs; got {bad[:5]}")
    if not pairs:
        raise InputError("order must name at least one (layer, head) to prune")
    if len(set(pairs)) != len(pairs):
        raise InputError("order names a head more than once")
    return pairs


def _metric(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise InputError(f"metric_fn must return one number; got a tensor of shape "
                             f"{tuple(value.shape)}")
        value = value.item()
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InputError(f"metric_fn must return a number; got {type(value).__name__}")
    if not math.isfinite(value):
        raise InputError("metric_fn returned NaN or inf")
    return float(value)


def _prune(pruned: Sequence[tuple[int, int]]) -> tuple[list[int], Callable[..., torch.Tensor]]:
    """Layers touched and an edit that zeroes the weights of the pruned heads."""
    by_layer: dict[int, list[int]] = {}
    for layer, head in pruned:
        by_layer.setdefault(layer, []).append(head)

    def edit(layer: int, pattern: torch.Tensor) -> torch.Tensor:
        gate = torch.ones(pattern.shape[1], dtype=pattern.dtype, device=pattern.device)
        gate[by_layer[layer]] = 0
        return pattern * gate[None, :, None, None]

    return sorted(by_layer), edit


def curve_points(n_order: int, steps: int | None) -> list[int]:
    """How many heads are pruned at each point after the first (unpruned) one: every count
    ``1..n_order`` (``steps=None``), or ``steps`` evenly spaced counts."""
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool)
                              or steps < 1):
        raise InputError(f"steps must be None or an integer >= 1; got {steps!r}")
    if steps is None:
        return list(range(1, n_order + 1))
    return sorted({round(i * n_order / steps) for i in range(1, steps + 1)} - {0})


def pruned_outputs(model: nn.Module, inputs: Inputs, order: Sequence[tuple[int, int]],
                   counts: Sequence[int]) -> Iterator[tuple[int, Any]]:
    """``(n, output)`` for each ``n`` in ``counts``: the model's output on ``inputs`` with the
    first ``n`` heads of ``order`` pruned (weights zeroed through a capture edit; the model
    itself is never changed)."""
    for n in counts:
        layers, edit = _prune(order[:n])
        with torch.no_grad(), capture(model, layers=layers, parts=[Edit(edit)]):
            output = model(**inputs)
        yield n, output


def pruning_curve(model: nn.Module, tokenizer: Any, texts: Sequence[str] | str,
                  metric_fn: MetricFn, order: Sequence[tuple[int, int]], *,
                  steps: int | None = None) -> pd.DataFrame:
    """Prune heads cumulatively in ``order`` and record ``metric_fn`` after each step.

    A pruned head has its attention weights zeroed (its output is exactly zero, Michel et
    al.'s ``ξ_h = 0``) through a :func:`attnprobe.capture` edit, so the model itself is never
    changed and every step starts from the intact model. All texts run as one batch, one
    forward per point of the curve; the first point is the unpruned model.

    Args:
        texts: the evaluation texts (one right-padded batch).
        metric_fn: ``metric_fn(output, inputs) -> number`` (a float or a one-element
            tensor), e.g. accuracy or mean similarity to a reference.
        order: ``(layer, head)`` pairs (or a frame with ``layer``/``head`` columns), pruned
            in this order — e.g. least important first from :func:`head_importance`
            (``frame.sort_values("importance")``).
        steps: ``None`` records a point after every head; ``n`` records ``n`` evenly spaced
            points (``round(i·len(order)/n)`` heads, Michel et al. prune 10% per step).

    Returns:
        Columns ``PRUNING_COLUMNS``: ``n_pruned``, ``share_pruned`` (of all the model's
        heads) and ``metric``; the first row has ``n_pruned == 0``.

    Raises:
        InputError: bad texts, an empty or repeating order, a layer or head out of range,
            a model with several attention stacks (layers would be ambiguous), bad ``steps``
            or a ``metric_fn`` that does not return a finite number.

    Example:
        >>> def copied(output, inputs):                 # the second copy, predicted
        ...     return (output[0, 8:-1].argmax(-1) == inputs["input_ids"][0, 9:]).float().mean()
        >>> curve = pruning_curve(lm, lm_tok, [prompt], copied, [(1, 0), (1, 1), (1, 2), (1, 3)])
        >>> curve["n_pruned"].tolist(), curve["share_pruned"].tolist()   # of lm's 8 heads
        ([0, 1, 2, 3, 4], [0.0, 0.125, 0.25, 0.375, 0.5])
        >>> curve["metric"]                             # copying as layer 1 is pruned
    """
    texts = check_inputs(texts)  # strings or token ids
    order = _check_order(order)
    counts = curve_points(len(order), steps)
    inputs = model_inputs(model, encode(model, tokenizer, texts))

    # the unpruned point; head 0 is kept only to learn the model's sites and head count
    with torch.no_grad(), capture(model, heads=[0]) as cap:
        output = model(**inputs)
    rows = [(0, 0.0, _metric(metric_fn(output, inputs)))]
    stacks = sorted({(s.stack, s.kind) for s in cap.sites})
    if len(stacks) != 1:
        raise InputError(f"pruning_curve addresses heads by (layer, head) and needs a model "
                         f"with one attention stack; this one has {stacks}")
    layers = sorted({s.layer for s in cap.sites})
    n_heads = cap.maps[0].info.n_heads
    bad = [(layer, head) for layer, head in order if layer not in layers or head >= n_heads]
    if bad:
        raise InputError(f"order names heads out of range {bad[:5]}: layers are "
                         f"{layers[0]}..{layers[-1]}, heads 0..{n_heads - 1}")
    del cap, output

    total = len(layers) * n_heads
    for n, output in pruned_outputs(model, inputs, order, counts):
        rows.append((n, n / total, _metric(metric_fn(output, inputs))))
    return pd.DataFrame(rows, columns=list(PRUNING_COLUMNS))
