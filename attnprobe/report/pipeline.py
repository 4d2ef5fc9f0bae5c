"""The report's analysis pipeline from Python: ``ap.report.from_model(model, tok, texts)``.

What ``attnprobe report`` runs, step by step (the command is a thin caller of
:func:`from_model`):

1. check what can be checked before any forward (the query row, a model or target that
   cannot generate);
2. the head census over every text (labels, scores, layer profile, clusters; syntax with
   ``syntax=True``);
3. on the first ``view_texts`` texts: the attribution comparison (with ``target``), their
   attention maps (the comparison's own maps with ``generate``: prompt + generated tokens)
   and the perturbation run (with ``perturb``);
4. on the first ``causal_texts`` texts (:mod:`attnprobe.report.causal`): for a pre-norm
   language model, the direct logit attribution of ``logit:next`` at every position and the
   composition scores (weights only); with ``corrupt``, the patching experiment ``patch``;
5. the page (:func:`~attnprobe.report.build`), which keeps these results in
   :attr:`Report.contents <attnprobe.report.page.Report.contents>`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from attnprobe.attribution.comparison import check_generation_target, compare
from attnprobe.attribution.view_common import check_query
from attnprobe.capture.corpus import extract
from attnprobe.capture.generation import check_generation
from attnprobe.capture.text import DEFAULT_BATCH_SIZE, Text, Truncation
from attnprobe.capture.token_ids import check_inputs
from attnprobe.core.checks import check_number
from attnprobe.core.metric import MetricFn, Positions, default_positions
from attnprobe.core.scope import ScopeLike
from attnprobe.heads.head_census import census
from attnprobe.perturb.experiments import reads_target, run
from attnprobe.report.causal import (
    DEFAULT_CAUSAL_TEXTS,
    PatchRequest,
    causal_results,
    check_patching,
)
from attnprobe.report.page import Report, build
from attnprobe.types import AttentionMap

__all__ = ["REPORT_METHODS", "REPORT_VIEWS", "from_model"]

# what the comparison section sets side by side: gradient, perturbation and attention views
REPORT_METHODS = ("integrated_gradients", "saliency", "leave_one_out")
REPORT_VIEWS = ("raw", "rollout")


def from_model(model: nn.Module, tokenizer: Any, texts: Sequence[Text] | str, *,
               scope: ScopeLike = "all", batch_size: int = DEFAULT_BATCH_SIZE,
               truncation: Truncation = "error", seed: int = 0, progress: bool = False,
               distributed: bool | None = None, max_length: int | None = None,
               syntax: bool = False, view_texts: int = 3, target: Any = None,
               n_steps: int = 20, query: str | int = "auto", perturb: str | None = None,
               perturb_options: Mapping[str, Any] | None = None,
               generate: int | None = None, sample: bool = False,
               logit_attribution: bool = True, composition: bool = True,
               causal_texts: int = DEFAULT_CAUSAL_TEXTS, corrupt: Sequence[Text] | None = None,
               patch: str = "heads", patch_options: Mapping[str, Any] | None = None,
               metric: str | MetricFn = "logit:next", metric_positions: Positions | None = None,
               title: str = "attnprobe report") -> Report:
    """Analyse ``model`` on ``texts`` and build the report page (``attnprobe report``).

    Args:
        model / tokenizer: any model the census reads (``ap.load_model``) and its tokenizer.
        texts: the corpus (strings or token ids); the census covers every text, the views
            the first ``view_texts``.
        scope / batch_size / truncation / seed / progress / distributed / max_length: the
            corpus signature, for the census. The view texts are cut to the model's limit
            (``max_length``) rather than refused, without a progress bar.
        syntax: parse the texts with spaCy: syntax scores and the syntax table (relations
            of at least 20 words).
        view_texts: texts in the attention view (and explained or perturbed), default 3.
        target: also compare attention with attributions (Integrated Gradients, saliency,
            leave-one-out vs raw attention and rollout) explaining ``target`` (``class:K``,
            ``next-token``, ``similarity:TEXT`` ...; :mod:`attnprobe.attribution.targets`).
        n_steps: Integrated Gradients steps for ``target``.
        query: the row the attention views of the comparison read (``auto``: the last real
            token of a causal model, ``[CLS]`` of an encoder; ``cls``, ``last``, ``mean``,
            ``max`` or an index).
        perturb: also run this perturbation experiment (``uniform``, ``ablate``,
            ``permute`` ...; :func:`attnprobe.perturb.run`) on the view texts, with
            ``perturb_options``; it is given ``target`` only if it reads one.
        generate / sample: causal language models: continue each view text by ``generate``
            tokens (sampled with ``sample``); the attention view covers prompt + generated
            tokens and ``target="next-token"`` explains every generated token.
        logit_attribution: pre-norm language models whose layout attnprobe knows
            (:func:`~attnprobe.capture.anatomy.anatomy`): the direct logit attribution of
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
        patch / patch_options: the patching experiment (``heads``: activation patching of
            each head's output, the default; ``path``; ``attribution``:
            :func:`attnprobe.patch.run`) and its options (``site``, ``direction``,
            ``receivers`` ...: :func:`attnprobe.patch.params_of`).
        metric / metric_positions: what patching measures (:mod:`attnprobe.core.metric`;
            default ``logit:next``, the clean input's next token in every run) and where a
            spec reads it (default :func:`~attnprobe.core.metric.default_positions`: every
            position with a next token for ``logit:next`` and ``loss``, the last for the
            others). Texts of one token have no next token: the causal sections leave them
            out and say so.
        title: the page title.

    Returns:
        The :class:`~attnprobe.report.page.Report`; ``report.contents`` holds the census,
        maps, comparison and perturbation table it shows. Under ``distributed`` every rank
        runs every step (each analysis splits its work) and returns the same page.

    Raises:
        InputError: a bad query, ``generate`` on a model (or with a target) that cannot
            generate, ``view_texts`` or ``causal_texts`` < 1, a patching request that
            cannot run (:func:`~attnprobe.report.causal.check_patching`: corrupted inputs of
            another count or token length, path patching on a post-norm model ...), all
            refused before any forward; and what the census, the comparison or the
            perturbation refuse (e.g. an unknown experiment).

    Example:
        >>> page = ap.report.from_model(model, tok, ["The cat sat.", "A dog barked."])
        >>> page.save("report.html")
        >>> page.contents.census.classify()  # the head table behind the page
        >>> corrupt = "t60 t61 t62 t63 t01 t02 t04 t06 t05 t11 t40 t03 t17 t42 t08 t55"
        >>> lm_page = ap.report.from_model(lm, lm_tok, [prompt], corrupt=[corrupt],
        ...                                metric_positions=list(range(9, 16)))
        >>> [s for s in ("sec-logit-attribution", "sec-composition", "sec-patching")
        ...  if f'id="{s}"' in lm_page.html]       # a pre-norm LM; MiniLM's page has none
        ['sec-logit-attribution', 'sec-composition', 'sec-patching']
    """
    check_number("view_texts", view_texts, integer=True, minimum=1)
    check_number("causal_texts", causal_texts, integer=True, minimum=1)
    _check_early(model, query, target, generate, perturb, perturb_options)
    texts = check_inputs(texts)  # None, a number ...: the one-line error of every entry point
    patching = None
    if corrupt is not None:
        where = default_positions(metric) if metric_positions is None else metric_positions
        patching = PatchRequest(tuple([corrupt] if isinstance(corrupt, str) else corrupt),
                                patch, dict(patch_options or {}), metric, where)
        check_patching(model, tokenizer, texts, patching, causal_texts=causal_texts,
                       max_length=max_length)
    found = census(model, tokenizer, texts, scope=scope, batch_size=batch_size,
                   truncation=truncation, seed=seed, progress=progress, syntax=syntax,
                   distributed=distributed, max_length=max_length)
    shown = texts[:view_texts]
    quiet: dict[str, Any] = {"scope": scope, "batch_size": batch_size, "seed": seed,
                             "progress": False, "truncation": "cut", "max_length": max_length,
                             "distributed": distributed}
    generation = {} if generate is None else {"generate": generate, "sample": sample}
    comparison = None
    if target is not None:
        comparison = compare(model, tokenizer, shown, target, methods=list(REPORT_METHODS),
                             views=list(REPORT_VIEWS), query=query, n_steps=n_steps,
                             **generation, **quiet)
    maps = _view_maps(model, tokenizer, shown, comparison, generation, quiet)
    perturbation = None
    if perturb is not None:
        options = dict(perturb_options or {})
        # target is for the attributions; the perturbation gets it only if it reads one
        reads = target is not None and reads_target(perturb, **options)
        perturbation = run(model, tokenizer, shown, perturb, target=target if reads else None,
                           **quiet, **options)
    causal = causal_results(model, tokenizer, texts, dla=logit_attribution,
                            compose=composition, patching=patching,
                            causal_texts=causal_texts, options=quiet)
    # every relation: the page leaves out the rare ones and says how many
    return build(maps=maps, census=found, syntax=found.syntax(1) if syntax else None,
                 comparison=comparison, perturbation=perturbation, title=title,
                 logit_attribution=causal.logit_attribution, composition=causal.composition,
                 patching=causal.patching)


def _check_early(model: nn.Module, query: str | int, target: Any, generate: int | None,
                 perturb: str | None, perturb_options: Mapping[str, Any] | None) -> None:
    """Refuse a bad ``query``, an unknown experiment or option, or a ``generate`` the model
    or the target cannot take, before the census runs."""
    check_query(query)  # type: ignore[arg-type]
    if perturb is not None:
        reads_target(perturb, **dict(perturb_options or {}))  # InputError: unknown or bad
    if generate is None:
        return
    if target is not None:
        check_generation_target(model, target, None, generate)
    else:
        check_generation(model, generate)


def _view_maps(model: nn.Module, tokenizer: Any, shown: list[Text], comparison: Any,
               generation: dict[str, Any], quiet: dict[str, Any]) -> list[AttentionMap]:
    """The attention view's maps: with ``generate`` and a target, the generations that were
    explained (the comparison's maps); else the view texts extracted."""
    if comparison is not None and comparison.maps:
        return list(comparison.maps)
    return extract(model, tokenizer, shown, **generation, **quiet)
