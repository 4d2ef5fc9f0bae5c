"""The explanations a faithfulness test scores, computed once per text: attribution methods
(signed scores, or magnitudes on request) and attention views, over the same token ids.

A :class:`SourceJob` holds what every text shares; :func:`explain_text` returns one
:class:`~attnprobe.types.TokenAttribution` per source (``scores [seq]``) and the target
fixed on the unperturbed text. The model-randomisation check
(:mod:`attnprobe.faithfulness.sanity`) reruns the same job on a randomised copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from attnprobe.attribution.attribution_options import AttributionOptions
from attnprobe.attribution.comparison_result import split_source
from attnprobe.attribution.methods import attribute_inputs
from attnprobe.attribution.targets import Target, refixed
from attnprobe.attribution.view_base import View, ViewInput
from attnprobe.attribution.views import run_views
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.scope import Scope
from attnprobe.errors import AttnProbeError, InputError
from attnprobe.inputs.text import model_inputs
from attnprobe.types import TokenAttribution

__all__ = ["SourceJob", "explain_text", "guarded_target", "source_kind"]


@dataclass(frozen=True)
class SourceJob:
    """What the explanations of every text share.

    Attributes:
        methods: attribution methods: names in :data:`~attnprobe.attribution.method_base.
            METHODS` or method objects.
        views: attention views, built and checked against the model.
        scope: the layers the views report (and the heads ``raw`` and ``norm`` average).
        last_layer: read a per-layer view at this layer only (None: every layer of the scope).
        corpus: what each attribution is given (one text, this process).
    """

    model: nn.Module
    tokenizer: Any
    target: Target
    methods: tuple[Any, ...]
    views: tuple[View, ...]
    scope: Scope
    query: str | int
    last_layer: int | None
    magnitude: bool
    corpus: CorpusOptions
    options: AttributionOptions

    @property
    def method_names(self) -> tuple[str, ...]:
        """The methods' names, as their results are named."""
        return tuple(m if isinstance(m, str) else m.name for m in self.methods)

    def on(self, model: nn.Module) -> SourceJob:
        """The same job on another model (the randomised copy of the sanity check)."""
        return replace(self, model=model)


def guarded_target(target: Any) -> Any:
    """``target`` as given, but a callable's own exception becomes a one-line
    :class:`~attnprobe.errors.InputError` naming it (a string spec or a
    :class:`~attnprobe.attribution.targets.Target` is returned unchanged)."""
    if isinstance(target, (str, Target)) or not callable(target):
        return target

    def guarded(output: Any, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        try:
            return target(output, inputs)
        except AttnProbeError:
            raise
        except Exception as error:
            raise InputError(f"the target callable raised {type(error).__name__}: "
                             f"{' '.join(str(error).split())}") from error

    return guarded


def source_kind(method_names: Sequence[str], source: str) -> str:
    """``"attribution"`` for a method's result, ``"attention"`` for a view's."""
    return "attribution" if source in method_names else "attention"


def _fixed_target(job: SourceJob, found: Sequence[TokenAttribution],
                  given: Mapping[str, torch.Tensor]) -> Target:
    """The target the views explain: the one the methods fixed on this text, or, with no
    method, the one fixed on a forward of the unperturbed text (``next-token`` must name
    the same token on every perturbed copy)."""
    if job.target.ready:
        return job.target
    if found:
        return refixed(job.target, found[0].target, job.model, job.tokenizer)
    inputs = model_inputs(job.model, dict(given))
    with torch.no_grad():
        return job.target.fixed(job.model(**inputs), inputs)


def explain_text(job: SourceJob, example: str, given: Mapping[str, torch.Tensor]
                 ) -> tuple[list[TokenAttribution], Target]:
    """Every source's importance of one text (``given``: ``input_ids`` / ``attention_mask``
    ``[1, seq]``), methods first, and the target fixed on it.

    Method scores are signed unless ``job.magnitude``; views are read at ``job.last_layer``
    when it is set.
    """
    found = attribute_inputs(job.model, job.tokenizer, [dict(given)], job.target, job.methods,
                             example_ids=[example], options=job.options,
                             corpus=job.corpus) if job.methods else []
    if job.magnitude:
        found = [replace(a, scores=a.scores.abs()) for a in found]
    fixed = _fixed_target(job, found, given)
    if not job.views:
        return found, fixed
    seen = run_views(job.views, ViewInput("", job.scope, job.query, fixed, example, job.model,
                                          job.tokenizer, inputs=dict(given)))
    if job.last_layer is not None:
        seen = [a for a in seen if split_source(a.method)[1] in (None, job.last_layer)]
    return [*found, *seen], fixed
