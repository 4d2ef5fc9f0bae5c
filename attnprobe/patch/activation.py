"""Activation patching per head (``experiment="heads"``; :func:`attnprobe.patch.heads`).

Follows the definition in [causal methods](../guide/causal-methods.md#activation-patching)
(Vig et al. 2020; Meng et al. 2022; Wang et al. 2022; Heimersheim & Nanda 2024): two inputs of
equal length, clean ``x`` and corrupted ``x̃``, and a scalar metric ``m``. **Denoising** runs
``x̃`` with one activation ``a`` — a head's output,
pattern, q, k or v, at every position or at one — set to its value in the run on ``x``:
``effect = (m_patched − m(x̃)) / (m(x) − m(x̃))`` (what is *sufficient*). **Noising** runs ``x``
with ``a`` from ``x̃``: ``effect = (m(x) − m_patched) / (m(x) − m(x̃))`` (what is *necessary*).

**Batched**: per batch of ``b`` examples, the clean and corrupted runs read the site's tensor
of every scoped layer once; then each forward runs the base input repeated for ``c`` patches
(``b · c <= batch_size`` rows), a different patch in every repetition
(:class:`~attnprobe.patch.units.RowPatch`). A forward's patches share their first patched
layer where they can (:func:`~attnprobe.patch.units.chunks`), and the layers before it do
not run again: they replay their outputs of the base run (:mod:`attnprobe.patch.late_tiling`).
Only the layers a forward patches are in its capture scope: the others keep the model's fast
attention (SDPA). Depths are counted by block calls, so a layer shared across depths (ALBERT)
repeats from its patched depth; the shortcut's first patched forward is checked against the
plain one (:meth:`~attnprobe.patch.late_tiling.LateTiling.confirm`). The loop over the
forwards, split over the ranks when distributed, is
:func:`~attnprobe.core.chunked.run_chunked` (path and stream patching run it too).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnprobe.capture.info import attention_sizes
from attnprobe.core.chunked import Chunk, run_chunked
from attnprobe.core.scope import Scope
from attnprobe.inputs.text import batch_spans
from attnprobe.patch.job import Job, Runs, register_experiment
from attnprobe.patch.late_tiling import LateTiling, Outputs
from attnprobe.patch.pairs import DIRECTIONS
from attnprobe.patch.params import Params, option
from attnprobe.patch.sites import SITES, SiteSpec, rewriter, site_spec
from attnprobe.patch.table import tidy
from attnprobe.patch.units import (
    PER,
    Placed,
    RowPatch,
    Unit,
    at_positions,
    chunks,
    in_order,
    placed_rows,
    tiled,
    units_of,
)

__all__ = ["POSITIONS", "HeadsParams", "SiteParams", "head_sizes", "patch_heads"]

RANK = 10  # the first patching experiment listed

POSITIONS = ("all", "each")


@dataclass(frozen=True)
class SiteParams(Params):
    """The options of an experiment that patches one site of the scoped heads (``heads``,
    ``attribution``)."""

    site: str = option("output", "the activation patched: per-head output z, pattern, q, k "
                       "or v (k/v: key/value heads)", choices=tuple(SITES))
    positions: str = option("all", "patch every position at once, or each position alone",
                            choices=POSITIONS)
    direction: str = option("denoising", "denoising: the corrupted run with clean "
                            "activations (sufficiency); noising: the reverse (necessity)",
                            choices=DIRECTIONS)

    def sites(self) -> list[str]:
        return [self.site]


@dataclass(frozen=True)
class HeadsParams(SiteParams):
    per: str = option("head", "what one patch covers: one head, one layer's scoped heads, or "
                      "every scoped head at once", choices=PER)


def head_sizes(job: Job, scope: Scope, tensors: tuple[str, ...]) -> dict[int, dict[str, int]]:
    """Per scoped layer, the heads along each tensor's head axis (read off one forward of the
    first clean example: grouped-query models have fewer key/value heads)."""
    first = slice(0, 1)
    clean, _ = job.pairs.encoded(job.model, job.tokenizer, first)
    _, acts = job.read(clean, scope, tensors)
    sizes: dict[int, dict[str, int]] = {}
    for name, layers in acts.items():
        for layer, tensor in layers.items():
            sizes.setdefault(layer, {})[name] = int(tensor.shape[1])
    return sizes


def query_tensor(site: str) -> str:
    """The tensor whose head axis counts the query heads next to ``site``'s own (``q`` for
    the grouped keys and values)."""
    spec = site_spec(site)
    return "q" if spec.kv_heads else spec.tensor


def axis_sizes(job: Job, scope: Scope, site: str) -> dict[int, tuple[int, int]]:
    """Per scoped layer ``(query heads, heads along the site's axis)``, from one forward of
    the first clean example."""
    spec, query = site_spec(site), query_tensor(site)
    found = head_sizes(job, scope, tuple(dict.fromkeys((query, spec.tensor))))
    return {layer: (names[query], names[spec.tensor]) for layer, names in found.items()}


@register_experiment("heads", HeadsParams, summary=(
    "activation patching: each scoped head's site (output, pattern, q, k, v) taken from the "
    "other run, at every position or each, per head, layer or the whole scope"))
def patch_heads(job: Job) -> pd.DataFrame:
    params: HeadsParams = job.params  # type: ignore[assignment]
    spec, query = site_spec(params.site), query_tensor(params.site)
    read_scope = Scope(layers=job.scope.layers_in(attention_sizes(job.model)[0]))
    spans = batch_spans(len(job.pairs), min(job.batch_size, len(job.pairs)))
    tensors = tuple(dict.fromkeys((spec.tensor, query)))
    tiling = _Tiling(LateTiling(job.model))
    found = job.baselines(spans, read_scope, tensors, partial(tiling.record, job))
    units = units_of(job.scope, {layer: (n[query], n[spec.tensor])
                                 for layer, n in found.sizes.items()}, params.per)

    def one(chunk: Chunk[Unit]) -> list[Placed]:
        runs = job.runs(chunk.span, read_scope, tensors, partial(tiling.record, job))
        values = _patched(job, tiling, runs, chunk.units, spec, tensors)
        return placed_rows(chunk, values, job.pairs.lengths, len(units))

    what = f"{len(units)} patch{'es' if len(units) != 1 else ''} of {params.site}"
    placed = run_chunked(one, spans, partial(at_positions, units, params.positions,
                                             job.pairs.lengths),
                         batch_size=job.batch_size, split=chunks, distributed=job.distributed,
                         progress=job.progress, desc=f"patch heads: {what}")
    return tidy("heads", in_order(placed), ids=job.pairs.ids, clean=found.clean,
                corrupt=found.corrupt, site=params.site, direction=job.direction,
                metric=job.plan.name, note=found.note)


@dataclass
class _Tiling:
    """The late-tiling shortcut of a job's patched forwards, and the base run's block outputs
    it replays (of the span :meth:`Job.runs` ran last)."""

    late: LateTiling
    recorded: Outputs = field(default_factory=dict)

    def record(self, job: Job, span: slice, run: str) -> AbstractContextManager[Any]:
        """Around each run of :meth:`Job.runs`: the base run's block outputs are recorded."""
        usable = run == job.base and self.late.usable
        return self.late.recording(self.recorded) if usable else nullcontext()


def _patched(job: Job, tiling: _Tiling, runs: Runs, units: Sequence[Unit], spec: SiteSpec,
             tensors: tuple[str, ...]) -> np.ndarray:
    """``[unit, example]``: the metric of the base run with each of ``units`` patched from
    the other run, in one forward (late-tiled where it can be, checked once against the
    plain forward: module docstring)."""
    late, base = tiling.late, runs.inputs[job.base]
    b = base["input_ids"].shape[0]
    source = runs.acts[job.other][spec.tensor]
    patch = RowPatch(units, b, base["input_ids"].device)

    def fn(layer: int, tensor: torch.Tensor) -> torch.Tensor:  # [rows, head, position, ...]
        return patch.apply(layer, tensor, source[layer])

    scope, parts, copies = Scope(layers=patch.layers), [rewriter(spec, fn)], len(units)
    values = None
    if _late(job, late, runs, tensors, min(patch.layers), copies, tiling.recorded):
        replay = tiling.recorded if late.replays else None
        with late.from_layer(min(patch.layers), b, copies, replay):
            output, _ = job.patched(base, scope, parts)
        values = job.measure(runs.metric, output, base, copies)
    if values is None or late.confirmed is None:  # the plain way, or the shortcut's check
        output, _ = job.patched(tiled(base, copies), scope, parts)
        plain = job.measure(runs.metric, output, base, copies)
        if values is not None:
            late.confirm(values, plain)
        values = plain
    return values


def _late(job: Job, late: LateTiling, runs: Runs, tensors: tuple[str, ...], start: int,
          copies: int, recorded: Outputs) -> bool:
    """Whether a forward of ``copies`` patches from layer ``start`` on repeats its examples
    only there, and (:attr:`LateTiling.replays`) replays the blocks before it from the
    base run's ``recorded`` outputs (:mod:`attnprobe.patch.late_tiling`; checked once per
    model)."""
    if start == 0 or copies < 2 or not late.usable:
        return False
    base = runs.inputs[job.base]
    first = Scope(layers=(start,))  # like a patched forward: the layers before it are left
    return late.check(lambda inputs: job.read(inputs, first, tensors)[0], start,
                      runs.values[job.base].numpy(),
                      lambda output, n: job.measure(runs.metric, output, base, n), base,
                      recorded)
