"""Attention versus gradient attributions: Captum adapters, attention-derived importance and
the agreement between them.

Modules: ``targets`` (what is explained: a class, a logit, a similarity, a next token),
``methods`` (the entry points :func:`attribute` / :func:`attribute_inputs`;
``gradient_methods`` the gradient attributions, ``perturbation_methods`` leave-one-out and
occlusion, ``method_base`` the :class:`Method` protocol and the :data:`METHODS` registry),
``views`` (importance read off the attention: raw rows, rollout, and the dispatch
:func:`attention_importance`; ``view_base`` holds the :class:`View` base class and the
:data:`VIEWS` registry, ``attention_flow`` flow, ``model_views`` attention × gradient and
norms, ``view_common`` the query spec — ``"auto"`` by model kind — and map helpers),
``metrics`` (rank and distribution agreement) and ``comparison`` (:func:`compare`: all of it
over a corpus, or over the tokens a causal LM generates, as tidy tables). A new attribution
method or attention view is one registered class in a module of this package: every module
here is imported with it (:func:`discover_extensions`), so no list names it. Captum and
transformers are imported when a function needs them.
"""

from types import ModuleType

from attnprobe.attribution.attention_flow import flow
from attnprobe.attribution.comparison import DEFAULT_VIEWS, Comparison, compare
from attnprobe.attribution.method_base import METHODS
from attnprobe.attribution.methods import (
    DEFAULT_METHODS,
    GradientShap,
    InputXGradient,
    IntegratedGradients,
    Saliency,
    attribute,
    attribute_inputs,
)
from attnprobe.attribution.metrics import (
    agreement,
    jsd,
    kendall_tau,
    spearman,
    topk_overlap,
    truth_scores,
)
from attnprobe.attribution.model_views import attention_x_gradient, norm_based, norm_importance
from attnprobe.attribution.perturbation_methods import LeaveOneOut, Occlusion
from attnprobe.attribution.targets import TARGET_KINDS, Target, parse_target
from attnprobe.attribution.view_base import VIEWS, View, ViewInput
from attnprobe.attribution.views import attention_importance, map_importance, raw, rollout
from attnprobe.core.plugins import import_modules

__all__ = [
    "DEFAULT_METHODS", "DEFAULT_VIEWS", "METHODS", "TARGET_KINDS", "VIEWS", "Comparison",
    "GradientShap", "InputXGradient", "IntegratedGradients", "LeaveOneOut", "Occlusion",
    "Saliency", "Target", "View", "ViewInput", "agreement", "attention_importance",
    "attention_x_gradient", "attribute", "attribute_inputs", "compare", "discover_extensions",
    "flow", "jsd", "kendall_tau", "map_importance", "norm_based", "norm_importance",
    "parse_target", "raw", "rollout", "spearman", "topk_overlap", "truth_scores",
]


def discover_extensions() -> list[ModuleType]:
    """Import every module of this package (those already imported are kept): a module that
    registers a view (:data:`VIEWS`) or a method (:data:`METHODS`) takes part without being
    listed anywhere.

    Example:
        >>> modules = discover_extensions()  # every module of the package, each imported once
        >>> "attnprobe.attribution.views" in [m.__name__ for m in modules] and "raw" in VIEWS
        True
    """
    return import_modules(__name__)


discover_extensions()
