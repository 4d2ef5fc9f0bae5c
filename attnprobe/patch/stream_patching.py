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

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnprobe.capture.info import attention_sizes
from attnprobe.capture.text import batch_spans
from attnprobe.core.metric import Metric
from attnprobe.errors import InputError
from attnprobe.patch.activation import POSITIONS
from attnprobe.patch.job import Job, register_experiment
from attnprobe.patch.pairs import DIRECTIONS
from attnprobe.patch.params import Params, option
from attnprobe.patch.stream import STREAM_SITES, Stream
from attnprobe.patch.table import Row, check_differs, tidy
from attnprobe.patch.units import RowPatch, Unit, chunks, forward_rows, tiled

__all__ = ["RESIDUAL", "MlpParams", "ResidualParams", "patch_mlp", "patch_residual"]

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


@register_experiment("residual", ResidualParams)
def patch_residual(job: Job) -> pd.DataFrame:
    return patch_stream(job, job.params.stream)  # type: ignore[attr-defined]


@register_experiment("mlp", MlpParams)
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
    cache: dict[tuple[int, int], _Runs] = {}

    def runs(span: slice) -> _Runs:
        key = (span.start, span.stop)
        if key not in cache:
            cache.clear()  # the patches of a span follow its runs: one span at a time
            cache[key] = _read(job, stream, span)
        return cache[key]

    def baseline(span: slice) -> tuple[np.ndarray, np.ndarray]:
        found = runs(span)
        return found.values["clean"], found.values["corrupt"]

    parts = job.sharded(baseline, spans, desc=f"patch {job.name}: clean and corrupted runs")
    clean = np.concatenate([p[0] for p in parts])
    corrupt = np.concatenate([p[1] for p in parts])
    note = check_differs(clean, corrupt, job.pairs.ids, job.plan.name)

    def span_units(span: slice) -> list[Unit]:
        widths = [None] if params.positions == "all" else range(max(job.pairs.lengths[span]))
        return [Unit(((layer, 0),), p) for layer in layers for p in widths]

    work = []
    for span in spans:
        todo = span_units(span)
        _, c = forward_rows(job.batch_size, span.stop - span.start, len(todo))
        work += [(span, start, stop) for start, stop in chunks(todo, c)]

    def one(item: tuple[slice, int, int]) -> list[Row]:
        span, start, stop = item
        chunk = span_units(span)[start:stop]
        found = runs(span)
        base = found.inputs[job.base]
        source = found.acts[job.other]
        b = base["input_ids"].shape[0]
        patch = RowPatch(chunk, b, base["input_ids"].device)

        def fn(layer: int, tensor: torch.Tensor) -> torch.Tensor:  # [rows, seq, d_model]
            # the vector is the one "head" of a [rows, 1, seq, d_model] view
            patch.apply(layer, tensor.unsqueeze(1), source[layer].unsqueeze(1))
            return tensor

        with torch.no_grad(), stream.rewriting(patch.layers, fn):
            output = job.model(**tiled(base, len(chunk)))
        values = job.measure(found.metric, output, base, len(chunk))  # [unit, example]
        rows = []
        for k, unit in enumerate(chunk):
            for t in range(b):
                i = span.start + t
                if unit.position is not None and unit.position >= job.pairs.lengths[i]:
                    continue  # padding of a shorter example
                rows.append(Row(i, unit.layer, None, unit.position, float(values[k, t])))
        return rows

    what = f"{len(layers)} layer(s) of {site}"
    done = job.sharded(one, work, desc=f"patch {job.name}: {what}")
    rows = sorted((row for part in done for row in part),
                  key=lambda r: (r.layer, -1 if r.position is None else r.position, r.example))
    return tidy(job.name, rows, ids=job.pairs.ids, clean=clean, corrupt=corrupt, site=site,
                direction=job.direction, metric=job.plan.name, note=note)


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
