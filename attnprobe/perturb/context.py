"""Apply one intervention inside a context: ``perturbed(model, intervention, scope)``.

The context opens :func:`attnprobe.capture` on the scoped layers with the intervention as the
edit (between softmax and values) or as the output edit (per-head outputs before the output
projection), so the model is always restored, no hook survives, and an intervention that did
not take effect is an error:

- the model cannot be edited at all (a transformers model that bypasses AttentionInterface,
  a module without hook points): :class:`~attnprobe.errors.AttentionUnavailableError`;
- an output intervention (``mean``) on a model without transformers' attention function
  (reference / hook-point models): :class:`~attnprobe.errors.InputError`, before any forward;
- a scoped layer whose attention never ran: :class:`~attnprobe.errors.HookNotFiredError`;
- an intervention that changed no weight at all (e.g. permuting uniform rows):
  :class:`~attnprobe.errors.EditNotAppliedError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from attnprobe.capture import Capture, Keep, Live, Values, capture
from attnprobe.capture import hf as hf_seam
from attnprobe.capture.info import attention_sizes, model_scope
from attnprobe.core.distributed import run_sharded
from attnprobe.core.scope import Scope, ScopeLike
from attnprobe.errors import InputError
from attnprobe.inputs.text import (
    DEFAULT_BATCH_SIZE,
    Truncation,
    batch_spans,
    check_inputs,
    encode,
    model_inputs,
)
from attnprobe.perturb.interventions import (
    INTERVENTIONS,
    Intervention,
    edit_part,
    make_intervention,
)

__all__ = ["head_output_means", "perturbed"]

_ALL = Scope()  # every head of every layer


def _intervention(value: Intervention | str) -> Intervention:
    if isinstance(value, str):
        return make_intervention(value)
    if not any(isinstance(value, INTERVENTIONS.get(n)) for n in INTERVENTIONS.names()):
        raise InputError(f"{type(value).__name__} is not a registered intervention; use "
                         "make_intervention(name, ...) with one of "
                         f"{', '.join(INTERVENTIONS.names())}")
    return value


@contextmanager
def perturbed(model: nn.Module, intervention: Intervention | str, scope: ScopeLike = _ALL,
              *, seed: int = 0, generator: torch.Generator | None = None, keep: bool = False,
              tokenizer: Any = None) -> Iterator[Capture]:
    """Run every forward inside the context with ``intervention`` applied to ``scope``.

    Args:
        model: a transformers model (any backend) or an attnprobe reference model.
        intervention: an object from :func:`make_intervention` (or just its name).
        scope: which layers × heads (a :class:`Scope` or its string form, e.g. ``"layer:3"``).
        seed: seeds a CPU ``torch.Generator`` for random interventions; the same seed gives
            the same draws, whatever the device.
        generator: use this generator instead (e.g. to continue one stream of draws across
            several contexts).
        keep: keep the *edited* patterns of the scoped heads in ``cap.maps`` (pattern
            interventions).
        tokenizer: names the tokens of ``cap.maps``.

    Yields:
        The :class:`~attnprobe.capture.Capture`; after the context, ``cap.edits`` holds the
        largest change per edited layer.

    Example:
        >>> with perturbed(model, make_intervention("uniform"), "layer:3") as cap:
        ...     out = model(**batch)
        >>> cap.edits[["layer", "max_abs_change"]]
    """
    intervention = _intervention(intervention)
    scope = model_scope(model, scope)
    if intervention.acts_on == "output" and not hf_seam.is_hf_model(model):
        raise InputError(f"{intervention.name} replaces per-head outputs inside transformers' "
                         f"attention function; {type(model).__name__} exposes only attention "
                         "patterns (use zero, uniform, permute, erase or dirichlet)")
    n_layers, n_heads = attention_sizes(model)
    intervention.check(scope.layers_in(n_layers), n_heads)  # e.g. mean: every layer has means
    if generator is None:
        generator = torch.Generator().manual_seed(seed)

    def edit(layer: int, tensor: torch.Tensor) -> torch.Tensor:
        return intervention(tensor, scope.heads_of(layer, tensor.shape[1]), generator,
                            layer=layer)

    parts = [edit_part(intervention, edit), *([Keep()] if keep else [])]
    with capture(model, scope, parts=parts, tokenizer=tokenizer) as cap:
        yield cap


def head_output_means(model: nn.Module, tokenizer: Any, texts: Sequence[str] | str, *,
                      layers: Sequence[int] | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
                      truncation: Truncation = "error", max_length: int | None = None,
                      distributed: bool | None = None) -> dict[int, torch.Tensor]:
    """Mean output of every head over the real tokens of ``texts``, for mean-ablation.

    Returns:
        ``{layer: Tensor[head, d_head]}`` (float32, CPU): the average over all real query
        positions of all texts of each head's output (weights times values, before the output
        projection).

    How it is recorded: an identity ``edit_output`` would make the capture raise
    EditNotAppliedError, so instead one plain capture per batch records each layer's weights
    (``live=True``, ``keep=False``: the tensors as computed, no copies) and value vectors
    (``values=True``), and the per-head outputs are recomputed as ``weights @ values`` — the
    same product the eager attention function forms (key/value heads already repeated for
    grouped-query attention).

    ``distributed`` (default: when a ``torch.distributed`` group is initialised) splits the
    batches over the ranks; every rank gets the per-batch sums and adds them in batch order,
    so the means equal the single-process ones exactly.

    Example:
        >>> means = head_output_means(model, tok, texts, layers=[0, 1])
        >>> sorted(means), means[0].shape     # {layer: [head, d_head]}; MiniLM: 384 / 12
        ([0, 1], torch.Size([12, 32]))
        >>> with perturbed(model, make_intervention("mean", means=means), "layer:0"):
        ...     ablated = model(**batch)                # every layer-0 head outputs its mean
    """
    if not hf_seam.is_hf_model(model):
        raise InputError(f"head outputs are recorded inside transformers' attention function; "
                         f"{type(model).__name__} is not a transformers model")
    if getattr(model.config, "is_encoder_decoder", False):
        raise InputError("mean-ablation means are keyed by layer; an encoder-decoder model has "
                         "several stacks per layer index")
    texts = check_inputs(texts)  # strings or token ids
    model_scope(model, Scope(layers=tuple(layers) if layers is not None else None))

    def batch_sums(part: slice) -> tuple[dict[int, torch.Tensor], int]:
        """Per layer ``[head, d_head]`` sums of the head outputs over the real tokens."""
        batch = encode(model, tokenizer, texts[part], truncation=truncation,
                       max_length=max_length)
        with torch.no_grad(), capture(model, layers=layers, parts=[Live(), Values()]) as cap:
            model(**model_inputs(model, batch))
        real = batch["attention_mask"].bool()  # [batch, query]
        sums = {}
        for site, weights in cap.live[0].items():
            values = cap.values[0][site]  # [batch, head, key, d_head]
            out = torch.matmul(weights, values.to(weights.dtype))  # [batch, head, query, d]
            sums[site.layer] = out.double().cpu().mul(real[:, None, :, None]).sum(dim=(0, 2))
        return sums, int(real.sum())

    parts = run_sharded(batch_sums, batch_spans(len(texts), batch_size),
                        distributed=distributed)
    count = sum(n for _, n in parts)
    totals: dict[int, torch.Tensor] = {}
    for sums, _ in parts:  # in batch order, as one process adds them
        for layer, total in sums.items():
            totals[layer] = totals[layer] + total if layer in totals else total
    return {layer: (total / count).float() for layer, total in sorted(totals.items())}
