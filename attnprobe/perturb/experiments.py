"""Perturbation experiments as tidy tables: ``run(model, tokenizer, texts, experiment)``.

Every experiment is one small function registered in :data:`EXPERIMENTS`, and every one
returns the columns :data:`RUN_COLUMNS`, so tables concatenate over experiments, models and
runs. The random-draw and one-edit experiments live here, ``erase``, ``adversarial`` and
``importance`` in :mod:`attnprobe.perturb.searches`; what they share (the registry, the job,
the rows) is in :mod:`attnprobe.perturb.job`:

===============  ===========================================================================
experiment       what it does (``perturbation`` column)
===============  ===========================================================================
``permute``      Jain & Wallace: per example, ``n_permutations`` permutations of the scoped
                 rows (each over its valid keys) in one batched forward, one permutation per
                 batch row; rows: the median / mean / max over the permutations of every
                 output change, and the example's ``max_attention`` (``permute``)
``dirichlet``    Wiegreffe & Pinter's random baseline: the same with ``n_permutations``
                 re-draws of every scoped row from Dirichlet(``alpha``) (``dirichlet``)
``uniform``      Kovaleva / W&P: uniform weights over the valid keys of the scope
``ablate``       Michel et al.: the scoped heads' weights zeroed, their output is 0 (``zero``)
``mean``         mean-ablation: the scoped heads' outputs replaced by their mean output over
                 the same ``texts`` (:func:`~attnprobe.perturb.head_output_means`; transformers
                 models only) (``mean``)
``erase``        Serrano & Smith: keys erased in every scoped row, one more per step, in three
                 orders — attention received, an attribution method (Integrated Gradients),
                 random; the change for ``k = 1..K`` and the fraction of keys erased before
                 the decision flips (``erase``)
``adversarial``  Jain & Wallace: per example and scoped layer, the most different attention
                 (JSD) that keeps the output within TVD ``eps`` (``adversarial``)
``importance``   Michel et al.: head importance ``E|∂L/∂ξ_h|`` of the scoped heads, and the
                 pruning curve in order of increasing importance (``zero``)
===============  ===========================================================================

**Columns.** ``experiment``, ``perturbation``, ``params`` (the perturbation's parameters as a
JSON object), ``scope`` (``"all"``, ``"layers:3"``, ``"heads:3.5"``; the scope the row's
perturbation acted on), ``example_id`` (the text's index as a string; ``"all"`` for rows about
the whole corpus), ``step`` (``k`` of ``erase``, heads pruned of ``importance``; ``<NA>`` for
experiments without steps), ``metric``, ``baseline`` (the metric without the perturbation),
``perturbed`` (with it) and ``change = perturbed − baseline``. Distances and scores of the
perturbation itself (``tvd``, ``jsd``, ``flip``, ``cosine_distance``, ``importance`` ...)
have ``baseline = 0``, so ``change == perturbed``.

**Outputs** (``output=``): ``"classifier"``, ``"lm"``, ``"embedding"`` or ``"auto"``; what each
reads and which metrics it reports is in :mod:`attnprobe.perturb.readout`.

**Each forward goes through the capture seam** (:func:`attnprobe.capture`), the unperturbed
one too, so baseline and perturbed outputs come from the same attention implementation and a
model whose attention cannot be reached fails at once: ``AttentionUnavailableError`` (no hook
points, a transformers model that bypasses AttentionInterface) or ``HookNotFiredError`` (a
scoped layer never ran), with the experiment named in the message. An edit that changed no
weight is ``EditNotAppliedError`` for ``uniform``/``ablate``/``mean``/``erase``. The
exception is ``permute`` (and ``dirichlet``): permuting a uniform row, or a row whose weight
sits on one key, is an identity, and "the output does not care" is then the measurement, so
such an example reports exactly zero change (the seam demonstrably ran: otherwise one of the
errors above is raised).

**Reproducible from ``seed``.** Permutation ``j`` of example ``i`` draws from its own CPU
generator seeded from ``(seed, i, j)``: the same call gives the same table, and batching the
permutations (``batch_size``) does not change any draw — ``n`` rows in one forward equal ``n``
forwards of one row.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from attnprobe.capture import capture
from attnprobe.capture.info import model_scope
from attnprobe.capture.text import batch_spans, check_texts
from attnprobe.core.registry import one_of
from attnprobe.core.scope import Scope
from attnprobe.errors import EditNotAppliedError, InputError
from attnprobe.perturb import searches  # noqa: F401  registers erase, adversarial, importance
from attnprobe.perturb.context import head_output_means
from attnprobe.perturb.interventions import INTERVENTIONS, Dirichlet, Mean, Permute, Uniform, Zero
from attnprobe.perturb.job import (
    COMMON_OPTIONS,
    CORPUS,
    EXPERIMENTS,
    RUN_COLUMNS,
    STREAMS,
    Experiment,
    Job,
    Row,
    clean_output,
    generator_for,
    named_errors,
    perturbed_output,
    register_experiment,
    repeat_inputs,
    rows_of,
)
from attnprobe.perturb.readout import (
    OUTPUTS,
    OutputChoice,
    Reader,
    distances_of,
    mean_row_max,
    measure,
    pick_reader,
    row_max_sums,
)

__all__ = ["CORPUS", "EXPERIMENTS", "OUTPUTS", "RUN_COLUMNS", "Experiment", "run"]


def _json(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


# ----------------------------------------------------------------------------- random draws
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


def _draws(job: Job, intervention: Any, perturbation: str, params: dict[str, Any]) -> list[Row]:
    rows = []
    n = job.n_permutations
    size = job.batch_size or n
    distances = distances_of(job.reader.kind)
    scope = str(job.scope)
    for i, text in job.examples():
        inputs = job.encode([text])
        with named_errors(job, f"example {i}"):
            before, cap = clean_output(job, inputs, keep=True)
            sums = [row_max_sums(m.pattern[None], m.pattern[None]) for m in cap.maps]  # per stack
            max_before = mean_row_max(sum(s[0] for s in sums), sum(s[1] for s in sums))[0]
            parts, max_after = [], []
            for start in range(0, n, size):
                count = min(n, start + size) - start
                edit = _RowEdit(intervention, job.scope,
                                [generator_for(job.seed, STREAMS["draws"], i, j)
                                 for j in range(start, start + count)])
                copies = repeat_inputs(inputs, count)
                try:
                    with torch.no_grad(), capture(job.model, job.scope, keep=False,
                                                  edit=edit):
                        output = job.model(**copies)
                    parts.append(job.reader(output, copies).detach())
                except EditNotAppliedError:  # no draw moved any weight: exactly no change
                    parts.append(before.expand(count, *before.shape[1:]))
                max_after.append(mean_row_max(*edit.after))
        measures = measure(job.reader.kind, before, torch.cat(parts))
        example = str(i)
        for metric in distances:
            values = measures[metric][1].numpy()
            for stat, value in (("median", np.median(values)), ("mean", values.mean()),
                                ("max", values.max())):
                rows.append(Row(perturbation, params, scope, example, None,
                                 f"{metric}_{stat}", 0.0, float(value)))
        rows.append(Row(perturbation, params, scope, example, None, "max_attention",
                         float(max_before), float(torch.cat(max_after).mean())))
    return rows


@register_experiment("permute")
def _permute(job: Job) -> list[Row]:
    """Jain & Wallace's permutations, ``n_permutations`` per example in one batch."""
    return _draws(job, Permute(), "permute", {"n_permutations": job.n_permutations,
                                              "seed": job.seed})


@register_experiment("dirichlet")
def _dirichlet(job: Job) -> list[Row]:
    """Wiegreffe & Pinter's random re-draws from Dirichlet(alpha), batched like permute."""
    return _draws(job, Dirichlet(alpha=job.alpha), "dirichlet",
                  {"alpha": job.alpha, "n_draws": job.n_permutations, "seed": job.seed})


# ----------------------------------------------------------------------------- one edit
def _one_shot(job: Job, intervention: Any, params: dict[str, Any]) -> list[Row]:
    rows = []
    scope = str(job.scope)
    spans = batch_spans(len(job.texts), job.batch_size or 16)
    if job.progress:
        from attnprobe.core.optional import require

        spans = require("tqdm").tqdm(spans, unit="batch", desc=f"perturb {job.name}")
    for span in spans:
        inputs = job.encode(job.texts[span])
        ids = ", ".join(str(i) for i in range(span.start, span.stop))
        where = f"text {ids}" if span.stop - span.start == 1 else f"texts {ids}"
        with named_errors(job, where):
            before, _ = clean_output(job, inputs)
            after = perturbed_output(job, intervention, inputs)
        measures = measure(job.reader.kind, before, after)
        for row, i in enumerate(range(span.start, span.stop)):
            rows += rows_of(measures, row, perturbation=intervention.name, params=params,
                             scope=scope, example=str(i))
    return rows


@register_experiment("uniform")
def _uniform(job: Job) -> list[Row]:
    """Uniform weights over the valid keys of every scoped row."""
    return _one_shot(job, Uniform(), {})


@register_experiment("ablate")
def _ablate(job: Job) -> list[Row]:
    """Zero-ablation: the scoped heads contribute nothing."""
    return _one_shot(job, Zero(), {})


@register_experiment("mean")
def _mean(job: Job) -> list[Row]:
    """Mean-ablation with each head's mean output over the same texts."""
    means = head_output_means(job.model, job.tokenizer, job.texts, layers=job.scope.layers,
                              truncation=job.options["truncation"])
    return _one_shot(job, Mean(means=means), {"means_from": "texts", "n_texts": len(job.texts)})


# ----------------------------------------------------------------------------- entry point
def _check_number(name: str, value: Any, *, integer: bool, minimum: float,
                  strict: bool = False) -> None:
    kind = "an integer" if integer else "a finite number"
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    if ok and not integer:
        ok = math.isfinite(value)
    if ok:
        ok = value > minimum if strict else value >= minimum
    if not ok:
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise InputError(f"{name} must be {kind} {bound}; got {value!r}")


def _options(name: str, experiment: Experiment, params: Mapping[str, Any]) -> dict[str, Any]:
    accepted = {**COMMON_OPTIONS, **experiment.options}
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise InputError(f"experiment {name!r} takes the options {', '.join(sorted(accepted))}; "
                         f"got {', '.join(unknown)}")
    options = {**accepted, **params}
    if options["batch_size"] is not None:
        _check_number("batch_size", options["batch_size"], integer=True, minimum=1)
    for key in ("n_adversaries", "steps", "n_steps"):
        if key in options:
            _check_number(key, options[key], integer=True, minimum=1)
    if "lr" in options:
        _check_number("lr", options["lr"], integer=False, minimum=0, strict=True)
    if options.get("prune_steps") is not None:
        _check_number("prune_steps", options["prune_steps"], integer=True, minimum=1)
    return options


def _experiment_named(name: Any) -> Experiment:
    if isinstance(name, str) and name in EXPERIMENTS:
        return EXPERIMENTS.get(name)
    message = one_of("experiment", name, EXPERIMENTS.names())
    if isinstance(name, str) and name in INTERVENTIONS:
        runs = {"zero": "ablate", "erase": "erase", "permute": "permute",
                "uniform": "uniform", "mean": "mean", "dirichlet": "dirichlet"}.get(name)
        message += f" ({name!r} is a perturbation; the experiment {runs!r} applies it)"
    raise InputError(message)


def run(model: nn.Module, tokenizer: Any, texts: Sequence[str] | str, experiment: str, *,
        scope: str | Scope = "all", output: OutputChoice = "auto", n_permutations: int = 100,
        seed: int = 0, eps: float = 0.01, k: int = 1, alpha: float = 1.0, target: Any = None,
        progress: bool = False, **params: Any) -> pd.DataFrame:
    """Run one perturbation experiment over ``texts`` and return a tidy table.

    Args:
        model / tokenizer: an attnprobe reference model or a transformers model (any
            attention backend), in eval mode, and its tokenizer.
        texts: the examples (one row group per text; ``example_id`` is the index).
        experiment: a name in :data:`EXPERIMENTS` (see the module docstring).
        scope: which heads are perturbed: ``"all"``, ``"layer:3"``, ``"layers:2,3"``,
            ``"head:3.5"``, ``"heads:3.5,3.7"`` or a :class:`~attnprobe.perturb.Scope`.
        output: ``"auto"``, ``"classifier"``, ``"lm"`` or ``"embedding"`` (module docstring).
        n_permutations: permutations (``permute``) or re-draws (``dirichlet``) per example.
        seed: seeds every random choice (permutations, draws, the random erasure order,
            adversary initialisations); the same call gives the same table.
        eps: ``adversarial``: the output budget ε (TVD of the output probabilities; for
            embedding models half the cosine distance).
        k: ``erase``: report the change for ``k = 1..K`` erased keys.
        alpha: ``dirichlet``: the concentration.
        target: ``erase``: what the attribution ranking explains (default: the predicted
            class ``class:K``, ``next-token``, or ``similarity:<the text itself>`` for
            embedding models); ``importance``: the loss is ``−target`` (default: the
            cross-entropy of the model's own prediction; embedding models need
            ``similarity:TEXT``). A spec such as ``"class:1"``, a Target or a callable.
        progress: show a progress bar (tqdm) over the texts.
        **params: options of the experiment: every experiment takes ``batch_size`` (forward
            rows: texts for uniform/ablate/mean, default 16; permutations or erasure steps per
            forward, default all of them) and ``truncation``; ``erase``: ``rankings`` (default
            attention, integrated_gradients, random; any attribution method name) and
            ``n_steps`` (Integrated Gradients); ``adversarial``: ``n_adversaries`` (5),
            ``steps`` (500), ``lr`` (0.01); ``importance``: ``prune_steps`` (None: a point
            after every head).

    Returns:
        A DataFrame with columns :data:`RUN_COLUMNS` (see the module docstring for each
        experiment's metrics).

    Raises:
        InputError: unknown experiment or option, empty texts, a bad scope or one out of
            range, ``n_permutations < 1``, ``k < 1``, ``eps <= 0``, ``alpha <= 0``, a model
            in training mode, an output the model does not give.
        AttentionUnavailableError / HookNotFiredError: the model's attention cannot be
            reached through the capture seam (the experiment and example are named).
        EditNotAppliedError: a deterministic perturbation changed no weight (not raised by
            permute / dirichlet, which report zero change).

    Example:
        >>> model, tok = ap.load_model("ref:bilstm-classifier")
        >>> table = ap.perturb.run(model, tok, ["the cat sat on the red mat"], "permute")
        >>> table.pivot(index="example_id", columns="metric", values="perturbed")
    """
    spec = _experiment_named(experiment)
    texts = check_texts(texts)
    options = _options(spec.name, spec, params)
    _check_number("n_permutations", n_permutations, integer=True, minimum=1)
    _check_number("seed", seed, integer=True, minimum=0)
    _check_number("k", k, integer=True, minimum=1)
    _check_number("eps (the TVD budget)", eps, integer=False, minimum=0, strict=True)
    _check_number("alpha", alpha, integer=False, minimum=0, strict=True)
    if output not in OUTPUTS:
        raise InputError(one_of("output", output, OUTPUTS))
    if not isinstance(model, nn.Module):
        raise InputError(f"model must be a torch module; got {type(model).__name__}")
    if any(m.training for m in model.modules()):
        raise InputError("the model is in training mode (dropout makes every number random): "
                         "call model.eval()")
    scope = model_scope(model, scope)
    job = Job(spec.name, model, tokenizer, texts, scope, Reader("classifier"), n_permutations,
              seed, float(eps), k, float(alpha), target, progress, options)
    first = job.encode(texts[:1])
    with named_errors(job, "unperturbed forward"), torch.no_grad(), \
            capture(model, scope, keep=False):
        first_output = model(**first)
    reader = pick_reader(model, output, first_output)
    reader(first_output, first)  # a clear error now when the output does not fit the kind
    job = replace(job, reader=reader)
    rows = spec.fn(job)
    table = pd.DataFrame(
        [(spec.name, r.perturbation, _json(r.params), r.scope, r.example_id, r.step, r.metric,
          r.baseline, r.perturbed, r.perturbed - r.baseline) for r in rows],
        columns=list(RUN_COLUMNS))
    table["step"] = table["step"].astype("Int64")
    for column in ("baseline", "perturbed", "change"):
        table[column] = table[column].astype("float64")
    return table
