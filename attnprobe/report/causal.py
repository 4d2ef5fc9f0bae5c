"""The causal step of the report's pipeline: direct logit attribution, composition and
patching (issue 18), computed for :func:`~attnprobe.report.from_model`.

==========================  ==================================================================
result                      when it is computed
==========================  ==================================================================
direct logit attribution    a pre-norm language model whose layout attnprobe knows
                            (:func:`~attnprobe.weights.anatomy.anatomy` does not refuse it) and
                            that has an unembedding: :data:`DLA_METRIC` at every position of
                            the first ``causal_texts`` texts (:func:`attnprobe.heads.
                            logit_attribution`)
composition                 the same models with two layers or more, from the weights
                            (:func:`attnprobe.heads.composition`)
patching                    the caller gives corrupted inputs (:class:`PatchRequest`): a
                            registered patching experiment (``heads`` by default;
                            :func:`attnprobe.patch.run`) over the pairs (text ``i``, corrupted
                            text ``i``) of the first ``causal_texts`` texts, on any model the
                            experiment serves
==========================  ==================================================================

Post-norm models (MiniLM, BERT) get neither of the first two: their residual is re-normalised
in every layer, so no exact linear decomposition exists. :func:`check_patching` refuses a bad
patching request before any forward (the census included).

A text of one token has no next token: the sections that read one (the direct logit
attribution, patching with ``logit:next`` or ``loss``) leave it out, keep the others' example
ids (the text's place in the report's list) and say so in a note on the page
(``table.attrs["notes"]``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from torch import nn

from attnprobe.core.checks import check_number
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.metric import MetricFn, Positions, reads_next_token
from attnprobe.errors import InputError
from attnprobe.heads.direct_logits import LogitAttribution, logit_attribution
from attnprobe.heads.head_composition import Composition, composition
from attnprobe.inputs.prepared import prepare
from attnprobe.inputs.text import Text
from attnprobe.patch.experiments import SHARED, params_of, run
from attnprobe.patch.pairs import MetricPlan, prepare_pairs
from attnprobe.patch.sites import check_served
from attnprobe.weights.anatomy import Anatomy, DecompositionError, anatomy

__all__ = ["DEFAULT_CAUSAL_TEXTS", "DLA_METRIC", "CausalResults", "PatchRequest",
           "causal_results", "check_patching", "decomposable"]

DLA_METRIC = "logit:next"  # read at every position: how each head predicts the next token
DEFAULT_CAUSAL_TEXTS = 8


@dataclass(frozen=True)
class PatchRequest:
    """What the patching section runs.

    Attributes:
        corrupt: one corrupted input per text of the report (same token length as it).
        experiment: a registered patching experiment (``heads``, ``path``, ``attribution``).
        options: the experiment's options (:func:`attnprobe.patch.params_of`), e.g.
            ``{"site": "k", "direction": "noising"}``.
        metric: a metric spec (:mod:`attnprobe.core.metric`) or a callable.
        metric_positions: where a spec metric reads (``last``, ``all`` or positions).
    """

    corrupt: tuple[Text, ...]
    experiment: str = "heads"
    options: Mapping[str, Any] = field(default_factory=dict)
    metric: str | MetricFn = "logit:next"
    metric_positions: Positions = "last"

    def sites(self) -> list[str]:
        """The sites the experiment reads or rewrites (checked against the model's seam)."""
        params = params_of(self.experiment).build(self.experiment, dict(self.options), SHARED)
        if self.experiment == "path":
            return ["output", *params.into]  # type: ignore[attr-defined]
        return [params.site]  # type: ignore[attr-defined]


@dataclass(frozen=True)
class CausalResults:
    """The causal sections' results (each None when it does not apply or was not asked)."""

    logit_attribution: LogitAttribution | None = None
    composition: Composition | None = None
    patching: pd.DataFrame | None = None


def decomposable(model: nn.Module) -> Anatomy | None:
    """The model's :class:`~attnprobe.weights.anatomy.Anatomy`, or None when attnprobe
    cannot decompose its residual stream (post-norm, encoder-decoder, unknown layout)."""
    try:
        return anatomy(model)
    except InputError:
        return None


def _headless(model: nn.Module) -> bool:
    """A transformers model without an output head (``BertModel``, ``GPT2Model``): no logits
    for a metric spec to read."""
    get = getattr(model, "get_output_embeddings", None)
    return callable(get) and getattr(model, "base_model", None) is model and get() is None


def check_patching(model: nn.Module, tokenizer: Any, texts: Sequence[Text],
                   request: PatchRequest, *, causal_texts: int,
                   max_length: int | None = None) -> None:
    """Refuse a patching request that cannot run, before any forward: a count of corrupted
    inputs other than the texts', an unknown experiment or option, a site the model's seam
    cannot serve, path patching on a model without a plain pre-norm residual, a metric spec
    on a model without logits or naming an unknown token, a pair of different token lengths
    (the first is named)."""
    if len(request.corrupt) != len(texts):
        raise InputError(f"{len(request.corrupt)} corrupted input(s) for {len(texts)} text(s); "
                         "give one corrupted input per text (same token length)")
    sites = request.sites()  # InputError: unknown experiment or option
    check_served(model, sites, f"patch {request.experiment}")
    if request.experiment == "path":
        params = params_of("path").build("path", dict(request.options), SHARED)
        if params.receivers is None:  # type: ignore[attr-defined]
            raise InputError("path patching needs receivers=SCOPE (CLI --receivers), e.g. "
                             "'layer:1'")
        try:
            anatomy(model)
        except InputError as exc:
            raise InputError(f"path patching freezes every other component at the base run, "
                             f"so it needs a pre-norm residual stream: {exc}") from None
    if isinstance(request.metric, str) and _headless(model):
        raise InputError(f"metric {request.metric!r} reads language-model logits, but "
                         f"{type(model).__name__} has no output head: load it with its LM head")
    n = min(causal_texts, len(texts))
    prepare_pairs(model, tokenizer, list(texts[:n]), list(request.corrupt[:n]), truncation="cut",
                  max_length=max_length)
    positions = request.metric_positions if isinstance(request.metric, str) else "last"
    MetricPlan(request.metric, tokenizer, positions, None, n)


def causal_results(model: nn.Module, tokenizer: Any, texts: Sequence[Text], *,
                   dla: bool, compose: bool, patching: PatchRequest | None,
                   causal_texts: int, corpus: CorpusOptions) -> CausalResults:
    """The results of the causal sections that apply to ``model`` (module docstring).

    Args:
        texts: the report's texts (prepared once by the report,
            :func:`~attnprobe.inputs.prepared.prepare`); the first ``causal_texts`` are read.
        dla / compose: compute direct logit attribution / composition where they apply.
        patching: the patching request, or None.
        corpus: the corpus options (:class:`~attnprobe.core.corpus_options.CorpusOptions`);
            path patching takes no scope.
    """
    check_number("causal_texts", causal_texts, integer=True, minimum=1)
    prepared = prepare(model, tokenizer, texts).head(causal_texts)
    shown = list(prepared)
    parts = decomposable(model) if dla or compose else None
    found_dla = found_composition = found_patching = None
    lengths = prepared.lengths() if dla or patching else []
    if dla and parts is not None and parts.unembed is not None:
        kept, note = _with_next_token(lengths, "direct logit attribution")
        try:
            found_dla = None if not kept else logit_attribution(
                model, tokenizer, prepared if len(kept) == len(shown) else
                [shown[i] for i in kept], DLA_METRIC, metric_positions="all", corpus=corpus)
        except DecompositionError as exc:  # say how to get the rest of the page
            raise DecompositionError(f"{exc} (logit_attribution=False, CLI "
                                     "--no-logit-attribution, leaves the section out)") from None
        if found_dla is not None:
            _renumber(found_dla.table, kept, note)
            _renumber(found_dla.totals, kept, note)
    if compose and parts is not None and parts.n_layers >= 2:
        found_composition = composition(model, seed=corpus.seed)
    if patching is not None:
        # path patching: senders / receivers instead of the scope
        walk = corpus.replace(scope="all") if patching.experiment == "path" else corpus
        positions = patching.metric_positions if isinstance(patching.metric, str) else "last"
        kept, note = _with_next_token(lengths, "patching") \
            if reads_next_token(patching.metric) else (list(range(len(shown))), None)
        corrupt = list(patching.corrupt[:causal_texts])
        if kept:
            found_patching = run(model, tokenizer, [shown[i] for i in kept],
                                 [corrupt[i] for i in kept], patching.metric,
                                 patching.experiment, metric_positions=positions,
                                 corpus=walk, **dict(patching.options))
            _renumber(found_patching, kept, note)
    return CausalResults(found_dla, found_composition, found_patching)


def _with_next_token(lengths: Sequence[int], section: str) -> tuple[list[int], str | None]:
    """The texts with a next token to read (two tokens or more), and the note naming the
    others (None when none is left out)."""
    kept = [i for i, n in enumerate(lengths) if n >= 2]
    left = [str(i) for i, n in enumerate(lengths) if n < 2]
    if not left:
        return kept, None
    return kept, (f"Text(s) {', '.join(left)} have one token, so no next token to read: "
                  f"left out of the {section}.")


def _renumber(table: pd.DataFrame, kept: Sequence[int], note: str | None) -> None:
    """``example_id`` of the rows of a run on the texts ``kept`` back to their place in the
    report's list, and ``note`` added to the notes the page shows."""
    if note is None:
        return
    table["example_id"] = [str(kept[int(i)]) for i in table["example_id"]]
    table.attrs["notes"] = [*table.attrs.get("notes", []), note]
