"""The ``knockout`` experiment: attention knockout (Geva et al. 2023, "Dissecting recall of
factual associations"): chosen edges (query ``i`` may not read key ``j``) are blocked in the
scoped layers and heads by closing them before the softmax — each row renormalises over the
keys it keeps, keys the model masks stay masked (:class:`~attnprobe.capture.Knockout`) — and
the change of the metric is measured. Blocking *after* the softmax without renormalising
(zero-ablation of an edge) is a different intervention and is not what this does.

``edges`` (:mod:`attnprobe.perturb.edges`): ``to:POSITIONS``, ``from:POSITIONS``,
``last-to:POSITIONS``, ``edge:Q>K,...`` or a callable ``(example, layer, head) -> bool
[query, key]``; positions count each example's real tokens. Texts run ``batch_size`` per
forward, each with its own edges (the knockout sees the whole padded batch); one row per
text and metric. ``sweep="layer"`` (``"head"``): each layer's scoped heads (each head) knocked
out alone, batched like the other sweeps (:mod:`attnprobe.perturb.sweeps`).

Reach it through :func:`~attnprobe.perturb.experiments.knockout` or
``run(..., "knockout", edges=...)``; the CLI is ``attnprobe perturb --experiment knockout
--edges SPEC``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnprobe.capture import Part, capture
from attnprobe.capture.info import causal_of
from attnprobe.errors import EditNotAppliedError, InputError
from attnprobe.inputs.text import batch_spans
from attnprobe.perturb.edges import EdgeMasks, Edges, RowUnit, parse_edges
from attnprobe.perturb.job import (
    Job,
    Row,
    clean_output,
    named_errors,
    register_experiment,
    rows_of,
)
from attnprobe.perturb.params import Params, option
from attnprobe.perturb.sweeps import Unit, UnitForward, unit_rows

__all__ = ["KnockoutParams"]

RANK = 50  # the last one listed

PERTURBATION = "knockout"


@dataclass(frozen=True)
class KnockoutParams(Params):
    """Options of ``knockout``."""

    edges: str | None = option(
        None, "the edges blocked: to:POSITIONS, from:POSITIONS, last-to:POSITIONS or "
              "edge:Q>K[,Q>K]; positions count real tokens (-1 = the last)",
        takes_callable=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.edges is not None:
            parse_edges(self.edges)  # a bad spec is a one-line error now, not mid-run

    def missing(self) -> str | None:
        if self.edges is not None:
            return None
        return ("knockout needs edges= (CLI --edges), e.g. 'to:0', 'last-to:1-3' or a "
                "callable (example, layer, head) -> bool [query, key]")


def _check_model(job: Job) -> None:
    config = getattr(job.model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        raise InputError("knockout resolves positions on one self-attention stack; "
                         f"{type(job.model).__name__} is an encoder-decoder model")


def _where(ids: Sequence[int]) -> str:
    return f"text {ids[0]}" if len(ids) == 1 else f"texts {', '.join(map(str, ids))}"


def _blocks_nothing(edges: Edges, ids: Sequence[int], what: str) -> EditNotAppliedError:
    texts = ", ".join(map(str, ids))
    return EditNotAppliedError(
        f"knockout {edges.spec!r} blocks no edge of {what} that text{'s' * (len(ids) > 1)} "
        f"{texts} could see (keys after the query are masked on a causal model; a named kind "
        "never blocks a token's edge to itself); choose other edges or drop the text")


def _knocked_output(job: Job, masks: EdgeMasks, inputs: Mapping[str, torch.Tensor],
                    ids: Sequence[int]) -> Any:
    """The output with ``masks`` knocked out; every text must lose an edge."""
    try:
        with torch.no_grad(), capture(job.model, job.scope, parts=[masks.part]):
            output = job.model(**inputs)
    except EditNotAppliedError:
        raise _blocks_nothing(masks.edges, [ids[r] for r in masks.idle()] or ids,
                              f"scope {job.scope}") from None
    idle = masks.idle()
    if idle:
        raise _blocks_nothing(masks.edges, [ids[r] for r in idle], f"scope {job.scope}")
    return output


@dataclass(frozen=True)
class _UnitKnockout:
    """A forward of a knockout sweep: row ``k·b + t`` knocks out unit ``k`` on text ``t``."""

    masks: EdgeMasks
    texts: int
    units: Sequence[Unit]

    @property
    def parts(self) -> list[Part]:
        return [self.masks.part]

    @property
    def changed(self) -> list[bool]:
        hit = self.masks.hit
        return [all(hit[k:k + self.texts]) for k in range(0, len(hit), self.texts)]

    def idle_texts(self, k: int) -> list[int]:
        """The texts (caller's indices) on which unit ``k`` blocked no edge."""
        rows = range(k * self.texts, (k + 1) * self.texts)
        return [self.masks.examples[r] for r in rows if not self.masks.hit[r]]


@dataclass(frozen=True)
class _EachUnit:
    """The knockout as a :class:`~attnprobe.perturb.sweeps.UnitPerturbation`."""

    edges: Edges
    causal: bool
    name: str = PERTURBATION

    def check(self, job: Job, units: Sequence[Unit]) -> None:
        _check_model(job)

    def forward(self, units: Sequence[Unit], ids: Sequence[int],
                inputs: Mapping[str, torch.Tensor]) -> UnitForward:
        real = inputs.get("attention_mask")
        if real is None:
            real = torch.ones_like(inputs["input_ids"])
        rows = [RowUnit(u.layer, u.heads) for u in units for _ in ids]
        masks = EdgeMasks(self.edges, real.repeat(len(units), 1), examples=list(ids) * len(units),
                          units=rows, causal=self.causal)
        return _UnitKnockout(masks, len(ids), units)

    def unchanged(self, units: Sequence[Unit], where: str,
                  forward: UnitForward | None) -> Exception:
        if isinstance(forward, _UnitKnockout):  # name the first unit and its idle texts
            k = next(k for k, moved in enumerate(forward.changed) if not moved)
            unit = forward.units[k]
            return _blocks_nothing(self.edges, forward.idle_texts(k), str(unit.scope))
        names = ", ".join(str(u.scope) for u in units)
        return EditNotAppliedError(
            f"knockout {self.edges.spec!r} blocks no edge of {names} on {where} that a row "
            "could see; leave it out of the scope, choose other edges or drop the text")


@register_experiment("knockout", KnockoutParams, sweeps=True, summary=(
    "Geva et al. 2023: the edges (to:, from:, last-to:, edge:Q>K or a callable) blocked "
    "before the softmax in the scoped heads, rows renormalised"))
def _knockout(job: Job) -> list[Row]:
    """Attention knockout of ``edges`` in the scoped heads (module docstring)."""
    _check_model(job)
    edges = parse_edges(job.params.edges)
    causal = bool(causal_of(job.model))
    params = job.record()
    if job.sweep:
        return unit_rows(job, _EachUnit(edges, causal), params)

    def batch(span: slice) -> list[Row]:
        ids = job.ids[span]
        inputs = job.encode(job.texts[span])
        with named_errors(job, _where(ids)):
            before, _ = clean_output(job, inputs, rows=ids)
            masks = EdgeMasks(edges, inputs, examples=ids, scope=job.scope, causal=causal)
            output = _knocked_output(job, masks, inputs, ids)
        measures = job.compare(before, job.read(output, inputs, ids))
        return [r for row, i in enumerate(ids)
                for r in rows_of(measures, row, perturbation=PERTURBATION, params=params,
                                 scope=job.scope, example=str(i))]

    parts = job.sharded(batch, batch_spans(len(job.texts), job.batch_size), unit="batch")
    return [row for part in parts for row in part]
