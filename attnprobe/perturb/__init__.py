"""Perturbation experiments: change attention weights (or a head's output) and measure how
much the model's output cares.

Modules: ``interventions`` (one registry of small parameter objects: permute, uniform, zero,
mean-ablate, erase, Dirichlet re-draw), ``scope`` (which layers and heads one touches),
``context`` (apply one inside a context that restores the model and verifies it took effect),
``measures`` (output and attention change), ``adversarial`` (the most different attention that
keeps the output within ε), ``importance`` (Michel et al.'s head importance and the pruning
curve) and ``experiments`` (:func:`run`: the experiments as tidy tables; ``readout`` reads and
compares the model's outputs, ``job`` holds what every experiment shares, ``searches`` the
erase, adversarial and importance experiments).
"""

from attnprobe._lazy import lazy_getattr

_LAZY = {
    "run": "experiments",
    "EXPERIMENTS": "experiments",
    "RUN_COLUMNS": "experiments",
    "Scope": "scope",
    "INTERVENTIONS": "interventions",
    "make_intervention": "interventions",
    "describe": "interventions",
    "Permute": "interventions",
    "Uniform": "interventions",
    "Zero": "interventions",
    "Erase": "interventions",
    "Dirichlet": "interventions",
    "Mean": "interventions",
    "attention_sizes": "scope",
    "perturbed": "context",
    "head_output_means": "context",
    "tvd": "measures",
    "jsd": "measures",
    "decision_flip": "measures",
    "cosine_distance": "measures",
    "logit_change": "measures",
    "prob_change": "measures",
    "attention_jsd": "measures",
    "output_change": "measures",
    "adversarial_attention": "adversarial",
    "AdversarialResult": "adversarial",
    "head_importance": "importance",
    "pruning_curve": "importance",
    "similarity_loss": "importance",
}

__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = sorted(_LAZY)
