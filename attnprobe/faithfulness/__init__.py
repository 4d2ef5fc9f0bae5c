"""Which explanation is faithful? Erasure tests of every attention view and attribution
method, side by side on one model, one set of inputs and one removal procedure.

:func:`evaluate` is the entry point (:mod:`~attnprobe.faithfulness.evaluate`); it returns a
:class:`Faithfulness` (:mod:`~attnprobe.faithfulness.result`). The pieces are public too:
the metrics (:mod:`~attnprobe.faithfulness.metrics`: comprehensiveness, sufficiency, AOPC,
deletion/insertion curves, ABPC, τ with leave-one-out, bootstrap CIs), the removal
procedures (:mod:`~attnprobe.faithfulness.removal`: delete, replace, mask out of attention)
and the model-randomisation check (:mod:`~attnprobe.faithfulness.sanity`).

Example:
    >>> result = ap.faithfulness.evaluate(model, tok, texts, "similarity:A kitten sleeps.",
    ...                                   methods=["saliency"], views=["raw"])
    >>> result.summary()
"""

from attnprobe.faithfulness.evaluate import evaluate
from attnprobe.faithfulness.metrics import (
    DEFAULT_LEVELS,
    abpc,
    aopc,
    bootstrap_ci,
    comprehensiveness,
    curve_area,
    curve_counts,
    leave_one_out_scores,
    loo_tau,
    random_ranking,
    ranking,
    removal_counts,
    sufficiency,
)
from attnprobe.faithfulness.options import DEFAULT_METHODS, DEFAULT_VIEWS, FaithfulnessOptions
from attnprobe.faithfulness.removal import (
    KINDS,
    Perturbed,
    Removal,
    pad_batch,
    perturb,
    perturb_ranked,
    removal_for,
    unique_inputs,
)
from attnprobe.faithfulness.result import Faithfulness
from attnprobe.faithfulness.sanity import randomized_copy

__all__ = [
    "DEFAULT_LEVELS", "DEFAULT_METHODS", "DEFAULT_VIEWS", "KINDS", "Faithfulness",
    "FaithfulnessOptions", "Perturbed", "Removal", "abpc", "aopc", "bootstrap_ci",
    "comprehensiveness", "curve_area", "curve_counts", "evaluate", "leave_one_out_scores",
    "loo_tau", "pad_batch", "perturb", "perturb_ranked", "random_ranking",
    "randomized_copy", "ranking", "removal_counts", "removal_for", "sufficiency",
    "unique_inputs",
]
