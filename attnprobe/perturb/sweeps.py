"""Per-head (and per-layer) sweeps: ``run(..., sweep="head")`` applies a deterministic
intervention (``uniform``, ``zero``, ``mean``) or a knockout to every head of the scope
*separately* and returns one row per head, text and metric — the rows 72 runs with
``scope="head:L.H"`` would give, in a fraction of the forwards. What is applied to each unit
is a :class:`UnitPerturbation` (:func:`unit_rows`); :func:`sweep_rows` wraps an intervention.

**How it is batched.** The texts are encoded ``b = min(batch_size, texts)`` at a time; each
such text batch is repeated once per unit (a head, or a layer's scoped heads) in one forward,
``c = batch_size // b`` units per forward (at least one), so a forward never has more than
``batch_size`` rows. Row ``k·b + t`` of the forward is text ``t`` with unit ``k`` perturbed:
the edit applies the intervention to the union of the units' heads of a layer and keeps, per
batch row, only the heads of that row's unit. The unperturbed output of a text batch is
computed once and shared by all of its units.

The rows equal the single-unit runs because the interventions act on every (batch row, head)
independently: up to float rounding between batch shapes (and between the eager and SDPA
attention the capture uses on layers in and out of scope), a sweep row is the row of
``run(..., scope=<that head>)``. Every unit is checked: a unit whose edit changed no weight
of a text batch is :class:`~attnprobe.errors.EditNotAppliedError`, as its single run would
be. Split over processes, the units of work are (text batch, unit chunk) pairs; each
process computes the unperturbed output of the text batches it touches, and every process
gets the single-process table.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch

from attnprobe.capture import Part, capture
from attnprobe.capture import hf as hf_seam
from attnprobe.capture.info import attention_sizes
from attnprobe.core.scope import Scope
from attnprobe.errors import EditNotAppliedError, InputError
from attnprobe.inputs.text import batch_spans
from attnprobe.perturb.interventions import edit_part
from attnprobe.perturb.job import SWEEPS, Job, Row, clean_output, named_errors, rows_of

__all__ = ["Unit", "UnitForward", "UnitPerturbation", "forward_rows", "sweep_rows",
           "sweep_units", "unit_rows"]


class Unit(NamedTuple):
    """What one batch row perturbs: ``heads`` of ``layer``; ``scope`` names them."""

    layer: int
    heads: tuple[int, ...]
    scope: Scope


def sweep_units(scope: Scope, n_layers: int, n_heads: int, sweep: str) -> list[Unit]:
    """The units of a sweep over ``scope``: each head (``"head"``) or each layer's scoped heads
    (``"layer"``), in layer then head order."""
    if sweep not in SWEEPS:
        raise InputError(f"unknown sweep {sweep!r}; choose one of "
                         f"{', '.join(map(repr, SWEEPS))} (or None)")
    if not n_layers or not n_heads:
        raise InputError("a sweep needs the model's numbers of layers and heads, which cannot "
                         "be read from its config or attention sites")
    units = []
    for layer in scope.layers_in(n_layers):
        heads = scope.heads_of(layer, n_heads)
        if sweep == "layer":
            whole = len(heads) == n_heads
            units.append(Unit(layer, heads, Scope(layers=(layer,), heads=None if whole
                                                  else heads)))
        else:
            units += [Unit(layer, (h,), Scope(layers=(layer,), heads=(h,))) for h in heads]
    return units


def forward_rows(batch_size: int, n_texts: int, n_units: int) -> tuple[int, int]:
    """``(texts, units)`` per forward: ``b`` texts repeated for ``c`` units, ``b·c`` rows,
    at most ``batch_size`` (module docstring)."""
    texts = min(batch_size, n_texts)
    return texts, max(1, min(n_units, batch_size // texts))


class UnitForward(Protocol):
    """One batched forward of a sweep: the capture parts (:func:`attnprobe.capture`) that
    apply each unit to its copy of the text batch, and, after the forward, whether each unit
    changed anything."""

    parts: list[Part]
    changed: list[bool]


class UnitPerturbation(Protocol):
    """What a sweep applies to every unit (an intervention, a knockout ...)."""

    name: str

    def check(self, job: Job, units: Sequence[Unit]) -> None:
        """Refuse, before any forward, units the model cannot take."""

    def forward(self, units: Sequence[Unit], ids: Sequence[int],
                inputs: Mapping[str, torch.Tensor]) -> UnitForward:
        """The forward of ``units`` on the text batch ``inputs`` (texts ``ids``); batch row
        ``k·b + t`` is text ``t`` with unit ``k`` applied."""

    def unchanged(self, units: Sequence[Unit], where: str,
                  forward: UnitForward | None) -> Exception:
        """The error for ``units`` that changed nothing on ``where`` (``forward``: the
        forward they were part of; None when the capture found nothing changed at all)."""


class _UnitEdit:
    """The batched edit: batch row ``k·b + t`` takes ``intervention`` on unit ``k``'s heads
    only; ``changed[k]`` notes whether unit ``k`` moved any weight (or output)."""

    def __init__(self, intervention: Any, units: Sequence[Unit], texts: int) -> None:
        self.intervention = intervention
        self.units = list(units)
        self.texts = texts
        self.changed = [False] * len(self.units)
        self.parts = [edit_part(intervention, self)]

    def __call__(self, layer: int, tensor: torch.Tensor) -> torch.Tensor:
        mine = [(k, u) for k, u in enumerate(self.units) if u.layer == layer]
        if not mine:
            return tensor
        heads = sorted({h for _, u in mine for h in u.heads})
        edited = self.intervention(tensor, heads, None, layer=layer)
        take = torch.zeros(tensor.shape[:2], dtype=torch.bool, device=tensor.device)
        for k, unit in mine:
            take[k * self.texts:(k + 1) * self.texts, list(unit.heads)] = True
        out = torch.where(take[:, :, None, None], edited, tensor)
        # NaN != NaN: a fully masked (padding) row holding NaN is no change
        moved = ((out != tensor) & ~(out.isnan() & tensor.isnan())).flatten(1).any(-1).cpu()
        for k, _ in mine:
            self.changed[k] = self.changed[k] or bool(moved[k * self.texts:
                                                              (k + 1) * self.texts].any())
        return out


@dataclass(frozen=True)
class _EachUnit:
    """An intervention (``uniform``, ``zero``, ``mean``) as a :class:`UnitPerturbation`."""

    intervention: Any

    @property
    def name(self) -> str:
        return self.intervention.name

    def check(self, job: Job, units: Sequence[Unit]) -> None:
        if self.intervention.acts_on == "output" and not hf_seam.is_hf_model(job.model):
            raise InputError(f"{self.name} replaces per-head outputs inside transformers' "
                             f"attention function; {type(job.model).__name__} is not a "
                             "transformers model")
        self.intervention.check(sorted({u.layer for u in units}), attention_sizes(job.model)[1])

    def forward(self, units: Sequence[Unit], ids: Sequence[int],
                inputs: Mapping[str, torch.Tensor]) -> UnitForward:
        return _UnitEdit(self.intervention, units, len(ids))

    def unchanged(self, units: Sequence[Unit], where: str,
                  forward: UnitForward | None) -> Exception:
        names = ", ".join(str(u.scope) for u in units)
        return EditNotAppliedError(
            f"{self.name} changed no attention weight of {names} on {where}: every row "
            "already looks the way it would make it (e.g. uniform, or all weight on one key); "
            "leave that head out of the scope or drop the text")


def _tiled(inputs: Mapping[str, Any], k: int) -> dict[str, Any]:
    """The batch repeated ``k`` times along the batch axis (copy ``j`` is rows ``j·b ..``)."""
    return {name: value.repeat(k, *[1] * (value.ndim - 1))
            if isinstance(value, torch.Tensor) and value.ndim else value
            for name, value in inputs.items()}


def _where(ids: Sequence[int]) -> str:
    return f"text {ids[0]}" if len(ids) == 1 else f"texts {', '.join(map(str, ids))}"


def sweep_rows(job: Job, intervention: Any, params: dict[str, Any]) -> list[Row]:
    """``intervention`` on each unit of ``job.scope`` (``job.sweep``) alone, over every text:
    one row per unit, text and metric, in unit then text order (module docstring)."""
    return unit_rows(job, _EachUnit(intervention), params)


def unit_rows(job: Job, perturbation: UnitPerturbation, params: dict[str, Any]) -> list[Row]:
    """``perturbation`` on each unit of ``job.scope`` (``job.sweep``) alone, over every text:
    one row per unit, text and metric, in unit then text order (module docstring)."""
    n_layers, n_heads = attention_sizes(job.model)
    units = sweep_units(job.scope, n_layers, n_heads, job.sweep or "")
    perturbation.check(job, units)
    texts, per_forward = forward_rows(job.batch_size, len(job.texts), len(units))
    work = [(span, start) for span in batch_spans(len(job.texts), texts)
            for start in range(0, len(units), per_forward)]
    clean: dict[int, tuple[dict[str, torch.Tensor], torch.Tensor]] = {}

    def run_one(item: tuple[slice, int]) -> list[tuple[int, int, list[Row]]]:
        span, start = item
        ids = job.ids[span]
        chunk = units[start:start + per_forward]
        where = _where(ids)
        if span.start not in clean:  # one text batch at a time (work is in text-batch order)
            clean.clear()
            inputs = job.encode(job.texts[span])
            with named_errors(job, where):
                clean[span.start] = (inputs, clean_output(job, inputs, rows=ids)[0])
        inputs, before = clean[span.start]
        b = len(ids)
        copies = _tiled(inputs, len(chunk))
        scope = functools.reduce(operator.or_, (u.scope for u in chunk))
        with named_errors(job, where):
            applied = perturbation.forward(chunk, ids, inputs)
            try:
                with torch.no_grad(), capture(job.model, scope, parts=applied.parts):
                    output = job.model(**copies)
            except EditNotAppliedError:
                raise perturbation.unchanged(chunk, where, None) from None
            idle = [u for u, moved in zip(chunk, applied.changed, strict=True) if not moved]
            if idle:
                raise perturbation.unchanged(idle, where, applied)
        after = job.read(output, copies, list(ids) * len(chunk))
        tiled = before.repeat(len(chunk), *[1] * (before.ndim - 1))  # row k·b + t: text t
        measures = job.compare(tiled, after)
        return [(start + k, span.start + t,
                 rows_of(measures, k * b + t, perturbation=perturbation.name, params=params,
                         scope=unit.scope, example=str(i)))
                for k, unit in enumerate(chunk) for t, i in enumerate(ids)]

    parts = job.sharded(run_one, work, unit="batch",
                        desc=f"perturb {job.name}: {len(units)} {job.sweep}s")
    found = sorted((item for part in parts for item in part), key=lambda x: x[:2])
    return [row for _, _, rows in found for row in rows]
