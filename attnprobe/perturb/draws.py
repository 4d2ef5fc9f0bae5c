"""The random-draw experiments: ``permute`` (Jain & Wallace's permutations) and ``dirichlet``
(Wiegreffe & Pinter's random re-draws). Per text, ``N`` draws of every scoped row, ``batch_size``
draws per forward (one draw per batch row), summarised as the median / mean / max output
change over the draws and the mean largest weight of a row after the draw. With a scalar
``metric`` (:mod:`attnprobe.perturb.scoring`), one row per summary (``summary`` column:
median, mean, min, max of the perturbed metric over the draws; ``baseline`` the unperturbed
metric).

Draw ``j`` of text ``i`` uses its own CPU generator seeded from ``(seed, i, j)`` (``i`` the
text's index in the caller's list), so neither the batching nor the split over processes
changes any draw. Memory stays flat in ``N`` except for the ``N × metrics`` distances the
median needs (8 bytes each; checked against the budget before the run).

Time grows with ``N`` × texts, so ``progress=True`` (the command line's default) counts
*draws*, not texts: the bar advances after every forward and shows the rate and the time
left, so a run that would take hours (``--permutations 100000000``) says so within seconds;
lower ``N`` or stop it (Ctrl-C).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from attnprobe.capture import Edit, capture
from attnprobe.core.distributed import rank_and_world
from attnprobe.core.optional import require
from attnprobe.core.scope import Scope
from attnprobe.errors import EditNotAppliedError, InputError
from attnprobe.perturb.adversarial import repeat_inputs
from attnprobe.perturb.budget import Footprint
from attnprobe.perturb.interventions import Dirichlet, Permute
from attnprobe.perturb.job import (
    STREAMS,
    Job,
    Row,
    clean_output,
    generator_for,
    named_errors,
    register_experiment,
)
from attnprobe.perturb.params import Params, option
from attnprobe.perturb.readout import distances_of, mean_row_max, row_max_sums

__all__ = ["DirichletParams", "PermuteParams", "per_text_draws"]

RANK = 10  # the first experiments listed

DISTANCE_BYTES = 8  # one float64 distance per draw and metric, kept for the median
SUMMARIES = ("median", "mean", "max")
SCALAR_SUMMARIES = ("median", "mean", "min", "max")  # a scalar metric moves both ways


class _RowEdit:
    """An edit that gives every batch row its own generator (row ``b`` draws exactly as a
    batch-1 forward with ``generators[b]`` would), and tallies each row's ``max_attention``
    after the edit over the scoped heads (``after``: sums and row counts per batch row)."""

    def __init__(self, intervention: Any, scope: Scope,
                 generators: Sequence[torch.Generator]) -> None:
        self.intervention = intervention
        self.scope = scope
        self.generators = list(generators)
        n = len(self.generators)
        self.after = (torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64))

    def __call__(self, layer: int, pattern: torch.Tensor) -> torch.Tensor:
        if pattern.shape[0] != len(self.generators):
            raise InputError(f"the forward ran a batch of {pattern.shape[0]} rows; expected "
                             f"{len(self.generators)} copies of one example")
        heads = self.scope.heads_of(layer, pattern.shape[1])
        edited = torch.cat([self.intervention(pattern[b:b + 1], heads, g, layer=layer)
                            for b, g in enumerate(self.generators)])
        index = list(heads)
        total, count = row_max_sums(edited[:, index].detach(), pattern[:, index].detach())
        self.after[0].add_(total)
        self.after[1].add_(count)
        return edited


class _DrawBar:
    """A tqdm bar over every draw of this process's texts (rank 0 draws it); a no-op when
    progress is off."""

    def __init__(self, job: Job, n: int) -> None:
        self._bar: Any = None
        if job.progress:
            rank, world = rank_and_world(job.distributed)
            total = n * len(job.texts[rank::world])
            self._bar = require("tqdm").tqdm(total=total, desc=f"perturb {job.name}",
                                             unit="draw", disable=rank != 0)

    def update(self, count: int) -> None:
        if self._bar is not None:
            self._bar.update(count)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def per_text_draws(job: Job, intervention: Any, n: int) -> list[Row]:
    """The rows of a random-draw experiment: ``n`` draws of ``intervention`` on every text,
    ``job.batch_size`` draws of one text per forward (module docstring), sharded over the
    texts, with a bar over the draws instead of the texts (one text can take hours).

    Args:
        job: the experiment's job (its scope, seed, metric and batch size).
        intervention: an attention intervention (:mod:`attnprobe.perturb.interventions`)
            called as ``intervention(pattern [1, head, query, key], heads, generator,
            layer=)``; draw ``j`` of text ``i`` gets the generator seeded from ``(seed, i,
            j)``.
        n: draws per text.

    Returns:
        Per text: the median / mean / max output change over the draws (or, with a scalar
        metric, one row per summary: median, mean, min, max) and ``max_attention`` before
        and after (the mean over the draws), ``perturbation`` ``intervention.name``.
    """
    bar = _DrawBar(job, n)
    try:
        quiet = replace(job, progress=False)
        return quiet.per_text(lambda i, text: _draws(quiet, intervention, n, i, text, bar))
    finally:
        bar.close()


def _draws(job: Job, intervention: Any, n: int, i: int, text: str,
           bar: _DrawBar | None = None) -> list[Row]:
    """``n`` draws of ``intervention`` on text ``i``, ``job.batch_size`` per forward."""
    metrics = (job.scalar.spec,) if job.scalar is not None else distances_of(job.reader.kind)
    inputs = job.encode([text])
    with named_errors(job, f"example {i}"):
        before, cap = clean_output(job, inputs, keep=True, rows=[i])
        sums = [row_max_sums(m.pattern[None], m.pattern[None]) for m in cap.maps]  # per stack
        max_before = float(mean_row_max(sum(s[0] for s in sums), sum(s[1] for s in sums))[0])
        values = np.empty((len(metrics), n))  # [metric, draw]
        baselines = np.zeros(len(metrics))
        max_after = 0.0
        for start in range(0, n, job.batch_size):
            count = min(n, start + job.batch_size) - start
            edit = _RowEdit(intervention, job.scope,
                            [generator_for(job.seed, STREAMS["draws"], i, j)
                             for j in range(start, start + count)])
            copies = repeat_inputs(inputs, count)
            try:
                with torch.no_grad(), capture(job.model, job.scope, parts=[Edit(edit)]):
                    output = job.model(**copies)
                after = job.read(output, copies, [i] * count)
            except EditNotAppliedError:  # no draw moved any weight: exactly no change
                after = before.expand(count, *before.shape[1:])
            measures = job.compare(before, after)
            for m, metric in enumerate(metrics):
                values[m, start:start + count] = measures[metric][1].numpy()
                baselines[m] = float(measures[metric][0][0])
            max_after += float(mean_row_max(*edit.after).sum())
            if bar is not None:
                bar.update(count)
    params = job.record()
    scope, example = str(job.scope), str(i)
    rows = []
    for m, metric in enumerate(metrics):
        summary = {"mean": values[m].mean(), "max": values[m].max(), "min": values[m].min()}
        # last: the median reorders the values in place rather than copy N of them
        summary["median"] = np.median(values[m], overwrite_input=True)
        if job.scalar is None:  # distances: the summary is part of the metric's name
            rows += [Row(intervention.name, params, scope, example, None, f"{metric}_{stat}",
                         0.0, float(summary[stat])) for stat in SUMMARIES]
        else:  # the metric's value over the draws; the summary is its own column
            rows += [Row(intervention.name, job.record(summary=stat), scope, example, None,
                         metric, float(baselines[m]), float(summary[stat]))
                     for stat in SCALAR_SUMMARIES]
    rows.append(Row(intervention.name, params, scope, example, None, "max_attention",
                    max_before, max_after / n))
    return rows


def _footprint(batch_size: int, n: int, option: str) -> Footprint:
    """``batch_size`` draws per forward; the distances of the ``n`` draws of one text held
    (at most three metrics, :func:`~attnprobe.perturb.readout.distances_of`)."""
    return Footprint(min(batch_size, n), held_count=n, held_each=DISTANCE_BYTES * 3,
                     held_by=option)


@dataclass(frozen=True)
class PermuteParams(Params):
    """Options of ``permute``."""

    n_permutations: int = option(100, "permutations per text", minimum=1,
                                 flag="--permutations")
    seeded = True

    def footprint(self, batch_size: int, n_texts: int, seq: int) -> Footprint:
        return _footprint(batch_size, self.n_permutations, "n_permutations")


@register_experiment("permute", PermuteParams, summary=(
    "Jain & Wallace: n_permutations permutations of the scoped rows per text (each over its "
    "valid keys); the median / mean / max output change and the max attention"))
def _permute(job: Job) -> list[Row]:
    """Jain & Wallace's permutations, ``n_permutations`` per text."""
    return per_text_draws(job, Permute(), job.params.n_permutations)


@dataclass(frozen=True)
class DirichletParams(Params):
    """Options of ``dirichlet``."""

    n_draws: int = option(100, "re-draws per text", minimum=1, flag="--draws")
    alpha: float = option(1.0, "Dirichlet concentration", minimum=0, strict=True)
    seeded = True

    def footprint(self, batch_size: int, n_texts: int, seq: int) -> Footprint:
        return _footprint(batch_size, self.n_draws, "n_draws")


@register_experiment("dirichlet", DirichletParams, summary=(
    "Wiegreffe & Pinter's random baseline: n_draws re-draws of every scoped row from "
    "Dirichlet(alpha), summarised like permute"))
def _dirichlet(job: Job) -> list[Row]:
    """Wiegreffe & Pinter's random re-draws from Dirichlet(alpha), batched like permute."""
    intervention = Dirichlet(alpha=job.params.alpha)
    return per_text_draws(job, intervention, job.params.n_draws)
