"""Attention versus gradient attributions: Captum adapters, attention-derived importance and
the agreement between them.

Modules: ``targets`` (what is explained: a class, a logit, a similarity, a next token),
``methods`` (gradient attributions and the entry point; ``method_base`` holds the shared pieces,
``perturbation_methods`` leave-one-out and occlusion), ``views`` (importance read off the
attention: raw rows, rollout; ``attention_flow`` flow, ``model_views`` attention × gradient and
norms; ``view_common`` the shared helpers), ``metrics`` (rank and distribution agreement) and
``comparison`` (:func:`compare`: all of it over a corpus, as tidy tables).
Captum and transformers are imported when a function needs them.
"""

from attnprobe._lazy import lazy_getattr

_LAZY = {
    "compare": "comparison",
    "Comparison": "comparison",
    "DEFAULT_VIEWS": "comparison",
    "attribute": "methods",
    "METHODS": "methods",
    "DEFAULT_METHODS": "methods",
    "IntegratedGradients": "methods",
    "Saliency": "methods",
    "InputXGradient": "methods",
    "GradientShap": "methods",
    "LeaveOneOut": "perturbation_methods",
    "Occlusion": "perturbation_methods",
    "parse_target": "targets",
    "Target": "targets",
    "TARGET_KINDS": "targets",
    "raw": "views",
    "rollout": "views",
    "flow": "attention_flow",
    "attention_x_gradient": "model_views",
    "norm_based": "model_views",
    "norm_importance": "model_views",
    "attention_importance": "views",
    "VIEWS": "views",
    "agreement": "metrics",
    "kendall_tau": "metrics",
    "spearman": "metrics",
    "topk_overlap": "metrics",
    "jsd": "metrics",
    "truth_scores": "metrics",
}

__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = sorted(_LAZY)
