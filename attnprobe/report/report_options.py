"""What the report's pipeline computes beyond the corpus options: one parameter object, so
:func:`~attnprobe.report.from_model` takes the corpus signature plus ``options``.

Example:
    >>> ReportOptions(target="next-token", view_texts=2).n_steps
    20
    >>> ReportOptions().with_keywords({"perturb": "uniform"}).perturb
    'uniform'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from attnprobe.core.checks import check_number
from attnprobe.core.corpus_options import AnalysisOptions
from attnprobe.core.metric import MetricFn, Positions
from attnprobe.report.causal import DEFAULT_CAUSAL_TEXTS

__all__ = ["REPORT_FIELDS", "ReportOptions"]


@dataclass(frozen=True)
class ReportOptions(AnalysisOptions):
    """The report's own options (the corpus options — scope, batch size, max length,
    truncation, seed, progress, distributed — are its
    :class:`~attnprobe.core.corpus_options.CorpusOptions`); checked when built.

    Attributes:
        syntax: parse the texts with spaCy: syntax scores and the syntax table (relations
            of at least 20 words).
        view_texts: texts in the attention view (and explained or perturbed), default 3.
        target: also compare attention with attributions (Integrated Gradients, saliency,
            leave-one-out vs raw attention and rollout) explaining ``target`` (``class:K``,
            ``next-token``, ``similarity:TEXT`` ...; :mod:`attnprobe.attribution.targets`).
        n_steps: Integrated Gradients steps for ``target``.
        faithfulness: with ``target``, also run the erasure tests
            (:func:`attnprobe.faithfulness.evaluate`) of the compared sources on the view
            texts: the faithfulness section (ranked summary with CIs, deletion curves).
        query: the row the attention views of the comparison read (``auto``: the last real
            token of a causal model, ``[CLS]`` of an encoder; ``cls``, ``last``, ``mean``,
            ``max`` or an index).
        perturb: also run this perturbation experiment (``uniform``, ``ablate``,
            ``permute`` ...; :func:`attnprobe.perturb.run`) on the view texts, with
            ``perturb_options``; it is given ``target`` only if it reads one.
        perturb_options: the perturbation experiment's options.
        generate: causal language models: continue each view text by ``generate`` tokens;
            the attention view covers prompt + generated tokens and
            ``target="next-token"`` explains every generated token.
        sample: with ``generate``, sample the tokens instead of taking the top one.
        logit_attribution: pre-norm language models whose layout attnprobe knows
            (:func:`~attnprobe.weights.anatomy.anatomy`): the direct logit attribution of
            ``logit:next`` at every position of the first ``causal_texts`` texts (the
            heads' heatmap and top heads). Post-norm models (MiniLM, BERT) get no such
            section.
        composition: the same models: Q/K/V-composition scores from the weights over
            their random baseline, and the strongest pairs.
        causal_texts: texts read by the direct logit attribution and patching (the first
            ones; default 8).
        corrupt: one corrupted input per text (each of the same token length as its text):
            also run the patching experiment ``patch`` on the pairs of the first
            ``causal_texts`` texts (any model the experiment serves), scoped like the
            census (path patching takes ``senders`` / ``receivers`` instead).
        patch: the patching experiment (``heads``: activation patching of each head's
            output, the default; ``path``; ``attribution``: :func:`attnprobe.patch.run`).
        patch_options: its options (``site``, ``direction``, ``receivers`` ...:
            :func:`attnprobe.patch.params_of`).
        metric: what patching measures (:mod:`attnprobe.core.metric`; default
            ``logit:next``, the clean input's next token in every run).
        metric_positions: where a spec reads it (default
            :func:`~attnprobe.core.metric.default_positions`: every position with a next
            token for ``logit:next`` and ``loss``, the last for the others). Texts of one
            token have no next token: the causal sections leave them out and say so.
        title: the page title.
    """

    owner: ClassVar[str] = "from_model()"

    syntax: bool = False
    view_texts: int = 3
    target: Any = None
    n_steps: int = 20
    faithfulness: bool = False
    query: str | int = "auto"
    perturb: str | None = None
    perturb_options: Mapping[str, Any] | None = None
    generate: int | None = None
    sample: bool = False
    logit_attribution: bool = True
    composition: bool = True
    causal_texts: int = DEFAULT_CAUSAL_TEXTS
    corrupt: Sequence[Any] | None = None
    patch: str = "heads"
    patch_options: Mapping[str, Any] | None = None
    metric: str | MetricFn = "logit:next"
    metric_positions: Positions | None = None
    title: str = "attnprobe report"

    def __post_init__(self) -> None:
        check_number("view_texts", self.view_texts, integer=True, minimum=1)
        check_number("causal_texts", self.causal_texts, integer=True, minimum=1)


REPORT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ReportOptions))
