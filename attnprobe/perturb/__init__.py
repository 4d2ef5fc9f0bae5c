"""Perturbation experiments: change attention weights (or a head's output) and measure how
much the model's output cares.

Building blocks: ``interventions`` (one registry of small parameter objects: permute, uniform,
zero, mean-ablate, erase, Dirichlet re-draw), ``context`` (apply one inside a context that
restores the model and verifies it took effect), ``measures`` (output and attention change),
``adversarial`` (the most different attention that keeps the output within ε) and
``importance`` (Michel et al.'s head importance and the pruning curve).

Experiments (:func:`run`, tidy tables; ``experiments`` documents what they share): each is
one function and one parameter dataclass (``params``) registered together with a one-line
summary (``job``, which also holds what they share) in a module of this package that
declares its ``RANK``; the modules are discovered when :data:`EXPERIMENTS` is first read, so
a new experiment is one module (``attnprobe perturb --help`` and the README list them all).
``sweeps`` runs an experiment on each head alone, batched (``run(..., sweep="head")``), and
``table`` makes the tidy table (:data:`RUN_COLUMNS`, then one column per parameter).
``readout`` reads and compares the model's outputs, ``budget`` estimates memory and
``run_checks`` refuses what cannot run, both before the first forward.
Which heads an intervention touches is a :class:`~attnprobe.core.scope.Scope`.
"""

from attnprobe.capture.info import attention_sizes
from attnprobe.core.scope import Scope
from attnprobe.perturb.adversarial import AdversarialResult, adversarial_attention
from attnprobe.perturb.context import head_output_means, perturbed
from attnprobe.perturb.draws import DirichletParams, PermuteParams
from attnprobe.perturb.edges import EDGE_KINDS, EdgeMasks, parse_edges
from attnprobe.perturb.experiments import (
    EXPERIMENTS,
    RUN_COLUMNS,
    SWEEPS,
    knockout,
    params_of,
    reads_metric,
    reads_target,
    run,
)
from attnprobe.perturb.importance import head_importance, pruning_curve, similarity_loss
from attnprobe.perturb.interventions import (
    INTERVENTIONS,
    Dirichlet,
    Erase,
    Mean,
    Permute,
    Uniform,
    Zero,
    describe,
    make_intervention,
)
from attnprobe.perturb.knockouts import KnockoutParams
from attnprobe.perturb.measures import (
    attention_jsd,
    cosine_distance,
    decision_flip,
    jsd,
    logit_change,
    output_change,
    prob_change,
    tvd,
)
from attnprobe.perturb.params import Params
from attnprobe.perturb.pruning import ImportanceParams
from attnprobe.perturb.searches import AdversarialParams, EraseParams

__all__ = [
    "EDGE_KINDS", "EXPERIMENTS", "INTERVENTIONS", "RUN_COLUMNS", "SWEEPS", "AdversarialParams",
    "AdversarialResult", "Dirichlet", "DirichletParams", "EdgeMasks", "Erase", "EraseParams",
    "ImportanceParams", "KnockoutParams", "Mean", "Params", "Permute", "PermuteParams", "Scope",
    "Uniform", "Zero",
    "adversarial_attention",
    "attention_jsd", "attention_sizes", "cosine_distance", "decision_flip", "describe",
    "head_importance", "head_output_means", "jsd", "knockout", "logit_change",
    "make_intervention", "output_change", "params_of", "parse_edges", "perturbed",
    "prob_change", "pruning_curve", "reads_metric", "reads_target", "run",
    "similarity_loss", "tvd",
]
