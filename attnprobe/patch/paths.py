"""Path patching (``experiment="path"``; :func:`attnprobe.patch.path`).

Follows [causal methods](../guide/causal-methods.md#path-patching) (Wang et al. 2022, IOI;
Goldowsky-Dill et al. 2023): a sender head's output from the other run reaches *only* the
chosen input (``q``, ``k`` and/or ``v``) of the receiver heads; every other path is frozen at
the run being patched (the base run: corrupted
when denoising, clean when noising). Three runs per patch:

A. the clean and corrupted runs (once per batch of examples) keep every head's output z of
   the layers up to the last receiver's, and every MLP output before it;
B. the base input with, in every layer before the last receiver's, each sender's z set to the
   other run's and every other head's z and every MLP output frozen at the base run's (so the
   residual reaching a receiver is the base residual − the sender's base output + its other
   output; norms are recomputed from it), recording the receivers' ``into`` inputs — the
   forward ends there;
C. the base input with only the receivers' ``into`` inputs replaced by those recorded in B;
   its metric is ``patched``, normalised like activation patching
   (:mod:`attnprobe.patch.table`).

Senders are each head of ``senders`` (``per="head"``), each layer's (``"layer"``) or all at
once (``"scope"``), at every position or one (``positions="each"``: the sender's output at
that position); only senders in layers before a receiver can reach one. B and C are batched
like :mod:`attnprobe.patch.activation`: one sender patch per repetition of the examples.
With grouped-query attention, a receiver's ``k``/``v`` is its key/value head, which the other
query heads of its group share.

Needs a pre-norm model whose residual stream is a plain sum (the MLPs are found by
:func:`attnprobe.weights.anatomy.anatomy`: GPT-2, LLaMA-layout decoders, attnprobe's reference
models).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import Any

import pandas as pd
import torch

from attnprobe.capture.info import attention_sizes, model_scope
from attnprobe.core.chunked import Chunk, run_chunked
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError
from attnprobe.inputs.text import batch_spans
from attnprobe.patch.activation import POSITIONS
from attnprobe.patch.frozen_mlps import MlpDepths
from attnprobe.patch.job import Job, register_experiment
from attnprobe.patch.pairs import DIRECTIONS
from attnprobe.patch.params import Params, option
from attnprobe.patch.sites import readers, rewriter, site_spec, tensors_of
from attnprobe.patch.table import PATH_COLUMNS, Row, tidy
from attnprobe.patch.units import (
    PER,
    Placed,
    RowPatch,
    Unit,
    at_positions,
    axis_heads,
    in_order,
    placed_rows,
    tiled,
    units_of,
)
from attnprobe.weights.anatomy import anatomy

__all__ = ["INTO", "PathParams", "patch_path"]

RANK = 20  # after activation patching

INTO = ("q", "k", "v")


@dataclass(frozen=True)
class PathParams(Params):
    receivers: str | None = option(None, "the receiver heads (a scope; required)",
                                   metavar="SCOPE")
    senders: str = option("all", "the sender heads (a scope)", metavar="SCOPE")
    into: tuple[str, ...] = option(("q",), "the receivers' inputs the senders reach "
                                   "(several: patched together)", choices=INTO)
    direction: str = option("denoising", "denoising: the corrupted run with clean "
                            "activations (sufficiency); noising: the reverse (necessity)",
                            choices=DIRECTIONS)
    positions: str = option("all", "patch every position at once, or each position alone",
                            choices=POSITIONS)
    per: str = option("head", "what one patch covers: one head, one layer's scoped heads, or "
                      "every scoped head at once", choices=PER)

    instead_of_scope = ("senders", "receivers")

    def sites(self) -> list[str]:
        return ["output", *self.into]


def _mlps(model: Any) -> MlpDepths:
    """The MLP of every depth (none for attention-only models)."""
    try:
        found = anatomy(model)
    except InputError as exc:
        raise InputError(f"path patching freezes every other component at the base run, so "
                         f"it needs a pre-norm residual stream: {exc}") from None
    return MlpDepths(model, {layer.index: layer.mlp for layer in found.layers
                             if layer.mlp is not None})


@register_experiment("path", PathParams, summary=(
    "path patching: each sender's output reaches only the receivers' into inputs (q, k, v); "
    "every other path frozen at the base run"))
def patch_path(job: Job) -> pd.DataFrame:
    params: PathParams = job.params  # type: ignore[assignment]
    receivers, senders, last = _scopes(job, params)
    read_scope = Scope(layers=tuple(range(last + 1)))
    mlps = _mlps(job.model)  # before any forward: a model without a plain residual
    kept: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    hooks = partial(_keep_mlps, mlps, kept, last)
    spans = batch_spans(len(job.pairs), min(job.batch_size, len(job.pairs)))
    tensors = tuple(dict.fromkeys(("z", "q", *params.into)))
    found = job.baselines(spans, read_scope, tensors, hooks)
    units = units_of(senders, {la: (n["z"], n["z"]) for la, n in found.sizes.items()
                               if la < last}, params.per)
    targets = {name: {la: torch.tensor(axis_heads(receivers, la, n["q"], n[name]))
                      for la, n in found.sizes.items() if receivers.wants_layer(la)
                      and axis_heads(receivers, la, n["q"], n[name])}
               for name in params.into}
    extra = (("receivers", str(receivers)), ("into", ",".join(params.into)))

    def one(chunk: Chunk[Unit]) -> list[Placed]:
        runs = job.runs(chunk.span, read_scope, tensors, hooks)
        base = runs.inputs[job.base]
        inputs = tiled(base, len(chunk.units))
        recorded = _run_b(job, runs, list(chunk.units), inputs, read_scope, params,
                          mlps, kept[(chunk.span.start, job.base)], last)
        if recorded is None:  # no sender changed anything: every row is the base run
            values = runs.values[job.base].numpy()[None].repeat(len(chunk.units), 0)
        else:
            values = _run_c(job, runs, recorded, targets, inputs, base, len(chunk.units))
        return placed_rows(chunk, values, job.pairs.lengths, len(units),
                           partial(_sender_row, extra))

    placed = run_chunked(one, spans, partial(at_positions, units, params.positions,
                                             job.pairs.lengths),
                         batch_size=job.batch_size, distributed=job.distributed,
                         progress=job.progress,
                         desc=f"patch path: {len(units)} sender patch(es)")
    return tidy("path", in_order(placed), ids=job.pairs.ids, clean=found.clean,
                corrupt=found.corrupt, site="output", direction=job.direction,
                metric=job.plan.name, note=found.note, columns=PATH_COLUMNS)


def _scopes(job: Job, params: PathParams) -> tuple[Scope, Scope, int]:
    """``(receivers, senders, the last receiver layer)``, refused before any forward when
    no receiver is given or no sender lies before the last receiver."""
    if params.receivers is None:
        raise InputError("path patching needs receivers=SCOPE (CLI --receivers), e.g. "
                         "'layer:1' or 'heads:1.0,1.2'")
    n_layers, _ = attention_sizes(job.model)
    receivers = model_scope(job.model, params.receivers)
    senders = model_scope(job.model, params.senders)
    last = max(receivers.layers_in(n_layers))
    if not any(layer < last for layer in senders.layers_in(n_layers)):
        raise InputError(f"no sender of {senders} lies in a layer before the last receiver "
                         f"layer ({last}): a sender reaches only later layers")
    return receivers, senders, last


def _keep_mlps(mlps: MlpDepths, kept: dict[tuple[int, str], dict[int, torch.Tensor]],
               last: int, span: slice, name: str) -> AbstractContextManager[Any]:
    """Around run ``name`` of ``span``: its MLP outputs before layer ``last`` go to
    ``kept[(span.start, name)]`` (only the latest span's are kept)."""
    if not any(key[0] == span.start for key in kept):
        kept.clear()
    return mlps.reading(kept.setdefault((span.start, name), {}), last)


def _sender_row(extra: tuple[tuple[str, Any], ...], example: int, unit: Unit,
                patched: float) -> Row:
    return Row(example, unit.layer, unit.head, unit.position, patched,
               (("sender_layer", unit.layer), ("sender_head", unit.head), *extra))


def _run_b(job: Job, runs: Any, chunk: list[Unit], inputs: dict[str, torch.Tensor],
           scope: Scope, params: PathParams, mlps: MlpDepths,
           mlp_values: dict[int, torch.Tensor], last: int
           ) -> dict[str, dict[int, torch.Tensor]] | None:
    """Run B (module docstring): the receivers' inputs per name and layer ``[rows, head,
    position, d_head]``, or None when no sender patch changed anything."""
    base_z = runs.acts[job.base]["z"]
    other_z = runs.acts[job.other]["z"]
    copies = len(chunk)
    patch = RowPatch(chunk, inputs["input_ids"].shape[0] // copies,
                     inputs["input_ids"].device)

    def senders_only(layer: int, z: torch.Tensor) -> torch.Tensor:
        if layer >= last:
            return z
        z.copy_(base_z[layer].repeat(copies, 1, 1, 1))  # every head frozen at the base run
        return patch.apply(layer, z, other_z[layer])  # ... but the senders

    parts = [rewriter(site_spec("output"), senders_only), *readers(params.into)]
    with mlps.frozen(mlp_values, copies):
        _, cap = job.patched(inputs, scope, parts, stop_early=True)
    if cap is None:
        return None
    return {name: tensors_of(cap, name) for name in params.into}


def _run_c(job: Job, runs: Any, recorded: dict[str, dict[int, torch.Tensor]],
           targets: dict[str, dict[int, torch.Tensor]], inputs: dict[str, torch.Tensor],
           base: dict[str, torch.Tensor], copies: int) -> Any:
    """Run C (module docstring): ``[copies, example]`` metric with the receivers' inputs
    replaced by ``recorded``."""
    parts = []
    moved: dict[tuple[str, int, torch.device], torch.Tensor] = {}  # once per layer's device

    def heads_on(name: str, layer: int, device: torch.device) -> torch.Tensor | None:
        heads = targets[name].get(layer)
        if heads is None or heads.device == device:
            return heads
        if (name, layer, device) not in moved:
            moved[(name, layer, device)] = heads.to(device)
        return moved[(name, layer, device)]

    for name in targets:
        def receive(layer: int, tensor: torch.Tensor, name: str = name) -> torch.Tensor:
            heads = heads_on(name, layer, tensor.device)
            if heads is not None:
                tensor[:, heads] = recorded[name][layer][:, heads].to(tensor.device,
                                                                       tensor.dtype)
            return tensor
        parts.append(rewriter(site_spec(name), receive))
    layers = sorted({la for found in targets.values() for la in found})
    output, _ = job.patched(inputs, Scope(layers=layers), parts)
    return job.measure(runs.metric, output, base, copies)
