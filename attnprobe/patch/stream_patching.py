"""Residual-stream and MLP-output patching per (layer, position) (``experiment="residual"``
and ``"mlp"``; :func:`attnprobe.patch.residual`, :func:`attnprobe.patch.mlp`).

TransformerLens's ``patching.get_act_patch_resid_pre`` (and ``resid_mid``, ``resid_post``,
``mlp_out``, as in ``get_act_patch_block_every``): the base run (corrupted when denoising,
clean when noising) with the site's vector ``[d_model]`` at one layer and one position — or at
every position of the layer (``positions="all"``) — set to its value in the other run;
``effect`` as for heads ([causal methods](../guide/causal-methods.md#activation-patching),
:mod:`attnprobe.patch.table`). The sites and how they are hooked: :mod:`attnprobe.patch.stream`.

**Batched** like :mod:`attnprobe.patch.activation`: per batch of ``b`` examples the clean and
corrupted runs read the site of every scoped layer once; each patched forward runs the base
input repeated for ``c`` patches (``b · c <= batch_size`` rows), patch ``k`` in rows
``k·b .. k·b + b`` (:class:`~attnprobe.patch.units.RowPatch`, the site's vector seen as one
"head"). The forwards run the model as it is loaded (no attention capture: nothing of the
attention is read), the clean and corrupted runs too.

By construction: denoising ``resid_pre`` of the first layer at every position gives the
clean run (effect 1), and ``resid_post`` of the last layer at the position the metric reads
gives the clean metric there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnprobe.capture.info import attention_sizes
from attnprobe.core.chunked import Chunk, run_chunked
from attnprobe.core.metric import Metric
from attnprobe.errors import InputError
from attnprobe.inputs.text import batch_spans
from attnprobe.patch.activation import POSITIONS
from attnprobe.patch.job import Job, register_experiment
from attnprobe.patch.pairs import DIRECTIONS
from attnprobe.patch.params import Params, option
from attnprobe.patch.stream import STREAM_SITES, Stream
from attnprobe.patch.table import Row, check_differs, tidy
from attnprobe.patch.units import (
    Placed,
    RowPatch,
    Unit,
    at_positions,
    chunks,
    in_order,
    placed_rows,
    tiled,
)

__all__ = ["RESIDUAL", "MlpParams", "ResidualParams", "patch_mlp", "patch_residual"]

RANK = 40  # after the head experiments

RESIDUAL = tuple(name for name in STREAM_SITES if name.startswith("resid_"))
POSITIONS_HELP = "residual and mlp patch each position alone by default"


@dataclass(frozen=True)
class MlpParams(Params):
    """The options of ``mlp`` (and, with ``stream``, of ``residual``)."""

    positions: str = option("each", POSITIONS_HELP, choices=POSITIONS)
    direction: str = option("denoising", "denoising: the corrupted run with clean "
                            "activations (sufficiency); noising: the reverse (necessity)",
                            choices=DIRECTIONS)


@dataclass(frozen=True)
class ResidualParams(MlpParams):
    stream: str = option("resid_pre", "the residual stream patched: entering the block "
                         "(resid_pre), after attention (resid_mid, pre-norm models) or "
                         "leaving it (resid_post)", choices=RESIDUAL)


@register_experiment("residual", ResidualParams, summary=(
    "the residual stream (stream: resid_pre, resid_mid, resid_post) of each layer x position "
    "taken from the other run"))
def patch_residual(job: Job) -> pd.DataFrame:
    return patch_stream(job, job.params.stream)  # type: ignore[attr-defined]


@register_experiment("mlp", MlpParams, summary=(
    "each MLP's output per layer x position taken from the other run (pre-norm models)"))
def patch_mlp(job: Job) -> pd.DataFrame:
    return patch_stream(job, "mlp_out")


@dataclass
class _Runs:
    """The clean and corrupted runs of one span: inputs, the site per layer ``[b, seq,
    d_model]``, the metric of each example ``[b]`` and the metric built for the span."""

    inputs: dict[str, dict[str, torch.Tensor]]
    acts: dict[str, dict[int, torch.Tensor]]
    values: dict[str, np.ndarray]
    metric: Metric


def _layers(job: Job, stream: Stream) -> tuple[int, ...]:
    """The scoped layers holding the site; a scope naming single heads is refused (a
    residual patch moves what every head and the MLP wrote)."""
    n_layers, n_heads = attention_sizes(job.model)
    wanted = job.scope.layers_in(n_layers)
    if any(job.scope.heads_of(layer, n_heads) != tuple(range(n_heads)) for layer in wanted):
        raise InputError(f"{stream.site.name} patching covers whole layers; the scope "
                         f"{job.scope} names single heads (use layer:N or layers:A-B)")
    layers = tuple(layer for layer in wanted if layer in stream.layers)
    if not layers:
        raise InputError(f"the scope {job.scope} holds no layer with {stream.site.name}")
    return layers


def patch_stream(job: Job, site: str) -> pd.DataFrame:
    """The table of patching ``site`` (:data:`~attnprobe.patch.stream.STREAM_SITES`) at each
    scoped layer × position (module docstring)."""
    params: MlpParams = job.params  # type: ignore[assignment]
    stream = Stream(job.model, site)  # refuses before any forward
    layers = _layers(job, stream)
    spans = batch_spans(len(job.pairs), min(job.batch_size, len(job.pairs)))
    runs = _SpanRuns(job, stream)
    parts = job.sharded(runs.baseline, spans,
                        desc=f"patch {job.name}: clean and corrupted runs")
    clean = np.concatenate([p[0] for p in parts])
    corrupt = np.concatenate([p[1] for p in parts])
    note = check_differs(clean, corrupt, job.pairs.ids, job.plan.name)
    units = [Unit(((layer, 0),)) for layer in layers]  # the site's vector: one "head"

    def one(chunk: Chunk[Unit]) -> list[Placed]:
        values = _patched(job, stream, runs(chunk.span), chunk.units)
        return placed_rows(chunk, values, job.pairs.lengths, len(units), _layer_row)

    placed = run_chunked(one, spans, partial(at_positions, units, params.positions,
                                             job.pairs.lengths),
                         batch_size=job.batch_size, split=chunks, distributed=job.distributed,
                         progress=job.progress,
                         desc=f"patch {job.name}: {len(layers)} layer(s) of {site}")
    return tidy(job.name, in_order(placed), ids=job.pairs.ids, clean=clean, corrupt=corrupt,
                site=site, direction=job.direction, metric=job.plan.name, note=note)


@dataclass
class _SpanRuns:
    """The clean and corrupted runs of a span reading the stream site (:func:`_read`), kept
    for the span read last: a span's patches follow its runs."""

    job: Job
    stream: Stream
    cache: dict[tuple[int, int], _Runs] = field(default_factory=dict)

    def __call__(self, span: slice) -> _Runs:
        key = (span.start, span.stop)
        if key not in self.cache:
            self.cache.clear()
            self.cache[key] = _read(self.job, self.stream, span)
        return self.cache[key]

    def baseline(self, span: slice) -> tuple[np.ndarray, np.ndarray]:
        """The clean and corrupted metric of each example of ``span`` ``[b]``."""
        found = self(span)
        return found.values["clean"], found.values["corrupt"]


def _patched(job: Job, stream: Stream, found: _Runs, units: Sequence[Unit]) -> np.ndarray:
    """``[unit, example]``: the metric of the base run with each unit's layer (at its
    position) taking the other run's vector, in one forward of ``len(units)`` copies."""
    base = found.inputs[job.base]
    source = found.acts[job.other]
    patch = RowPatch(units, base["input_ids"].shape[0], base["input_ids"].device)

    def fn(layer: int, tensor: torch.Tensor) -> torch.Tensor:  # [rows, seq, d_model]
        # the vector is the one "head" of a [rows, 1, seq, d_model] view
        patch.apply(layer, tensor.unsqueeze(1), source[layer].unsqueeze(1))
        return tensor

    with torch.no_grad(), stream.rewriting(patch.layers, fn):
        output = job.model(**tiled(base, len(units)))
    return job.measure(found.metric, output, base, len(units))


def _layer_row(example: int, unit: Unit, patched: float) -> Row:
    return Row(example, unit.layer, None, unit.position, patched)


def _read(job: Job, stream: Stream, span: slice) -> _Runs:
    """The clean and corrupted runs of ``span`` reading the site (clean first: a
    ``next-token`` metric is fixed on it)."""
    clean, corrupt = job.pairs.encoded(job.model, job.tokenizer, span)
    inputs = {"clean": clean, "corrupt": corrupt}
    metric = job.plan.build(job.pairs.index[span], clean["input_ids"].shape[1])
    acts: dict[str, dict[int, torch.Tensor]] = {}
    values: dict[str, np.ndarray] = {}
    for name in ("clean", "corrupt"):
        acts[name] = {}
        with torch.no_grad(), stream.reading(acts[name]):
            output: Any = job.model(**inputs[name])
        if name == "clean":
            metric = metric.fixed(output, inputs[name])
        values[name] = job.plan.values(metric, output, inputs[name]).numpy()
    return _Runs(inputs, acts, values, metric)
