"""Attention versus gradient attributions: Captum adapters, attention-derived importance and
the agreement between them.

Modules: ``targets`` (what is explained: a class, a logit, a similarity, a next token),
``methods`` (gradient and perturbation attributions), ``views`` (importance read off the
attention: raw rows, rollout, flow, attention × gradient, norms), ``metrics`` (rank and
distribution agreement) and ``compare`` (all of it over a corpus, as tidy tables).
Captum and transformers are imported when a function needs them.
"""

from importlib import import_module
from typing import Any

_LAZY = {
    "compare": "compare",
    "Comparison": "compare",
    "DEFAULT_VIEWS": "compare",
    "attribute": "methods",
    "METHODS": "methods",
    "DEFAULT_METHODS": "methods",
    "IntegratedGradients": "methods",
    "Saliency": "methods",
    "InputXGradient": "methods",
    "GradientShap": "methods",
    "LeaveOneOut": "methods",
    "Occlusion": "methods",
    "parse_target": "targets",
    "Target": "targets",
    "TARGET_KINDS": "targets",
    "raw": "views",
    "rollout": "views",
    "flow": "views",
    "attention_x_gradient": "views",
    "norm_based": "views",
    "norm_importance": "views",
    "attention_importance": "views",
    "VIEWS": "views",
    "agreement": "metrics",
    "kendall_tau": "metrics",
    "spearman": "metrics",
    "topk_overlap": "metrics",
    "jsd": "metrics",
    "truth_scores": "metrics",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f"attnprobe.attribution.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'attnprobe.attribution' has no attribute {name!r}")


__all__ = sorted(_LAZY)
