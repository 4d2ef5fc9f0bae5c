"""The one-edit experiments: ``uniform`` (uniform weights over the valid keys), ``ablate``
(Michel et al.'s zero-ablation) and ``mean`` (each head's output replaced by its mean output
over the same texts). Texts run ``batch_size`` per forward; one row per text and metric.
None of them takes options of its own (their parameter class is the empty
:class:`~attnprobe.perturb.params.Params`).

Each also runs as a sweep (``run(..., sweep="head")`` or ``"layer"``): every head (layer) of
the scope perturbed alone, batched as :mod:`attnprobe.perturb.sweeps` describes; one row per
head (layer), text and metric.
"""

from __future__ import annotations

from typing import Any

from attnprobe.inputs.text import batch_spans
from attnprobe.perturb.context import head_output_means
from attnprobe.perturb.interventions import Mean, Uniform, Zero
from attnprobe.perturb.job import (
    Job,
    Row,
    clean_output,
    named_errors,
    perturbed_output,
    register_experiment,
    rows_of,
)
from attnprobe.perturb.sweeps import sweep_rows

__all__ = ["one_shot"]

RANK = 20  # after the random draws


def one_shot(job: Job, intervention: Any, params: dict[str, Any]) -> list[Row]:
    """The rows of a one-edit experiment: ``intervention`` on every text, ``batch_size``
    texts per forward (the batches are the units split over processes, so a split run pads
    exactly as one process does); with ``job.sweep``, on each head (layer) of the scope
    alone (:func:`~attnprobe.perturb.sweeps.sweep_rows`).

    Args:
        job: the experiment's job.
        intervention: an attention intervention (:mod:`attnprobe.perturb.interventions`).
        params: the rows' parameter columns (:meth:`~attnprobe.perturb.job.Job.record`).

    Returns:
        One row per text (per head or layer in a sweep) and metric, ``perturbation``
        ``intervention.name``; an :class:`~attnprobe.errors.EditNotAppliedError` when the
        edit changed no weight.
    """
    if job.sweep:
        return sweep_rows(job, intervention, params)
    scope = job.scope

    def batch(span: slice) -> list[Row]:
        ids = job.ids[span]
        inputs = job.encode(job.texts[span])
        where = f"text {ids[0]}" if len(ids) == 1 else f"texts {', '.join(map(str, ids))}"
        with named_errors(job, where):
            before, _ = clean_output(job, inputs, rows=ids)
            after = perturbed_output(job, intervention, inputs, rows=ids)
        measures = job.compare(before, after)
        return [r for row, i in enumerate(ids)
                for r in rows_of(measures, row, perturbation=intervention.name, params=params,
                                 scope=scope, example=str(i))]

    parts = job.sharded(batch, batch_spans(len(job.texts), job.batch_size), unit="batch")
    return [row for part in parts for row in part]


@register_experiment("uniform", sweeps=True, summary=(
    "Kovaleva et al. / Wiegreffe & Pinter: uniform weights over the valid keys of every "
    "scoped row"))
def _uniform(job: Job) -> list[Row]:
    """Uniform weights over the valid keys of every scoped row."""
    return one_shot(job, Uniform(), job.record())


@register_experiment("ablate", sweeps=True, summary=(
    "Michel et al.: the scoped heads' weights zeroed, so their output is 0"))
def _ablate(job: Job) -> list[Row]:
    """Zero-ablation: the scoped heads contribute nothing."""
    return one_shot(job, Zero(), job.record())


@register_experiment("mean", sweeps=True, summary=(
    "mean-ablation: the scoped heads' outputs replaced by their mean output over the same "
    "texts (transformers models)"))
def _mean(job: Job) -> list[Row]:
    """Mean-ablation with each head's mean output over the same texts (summed over every
    process before use, when split)."""
    means = head_output_means(job.model, job.tokenizer, list(job.texts),
                              layers=job.scope.layers, batch_size=job.batch_size,
                              truncation=job.truncation, max_length=job.max_length,
                              distributed=job.distributed)
    return one_shot(job, Mean(means=means),
                     job.record(means_from="texts", n_texts=len(job.texts)))
