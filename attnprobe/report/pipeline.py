"""The report's analysis pipeline from Python: ``ap.report.from_model(model, tok, texts)``.

What ``attnprobe report`` runs, step by step (the command is a thin caller of
:func:`from_model`):

1. check what can be checked before any forward (the query row, a model or target that
   cannot generate);
2. the head census over every text (labels, scores, layer profile, clusters; syntax with
   ``syntax=True``);
3. on the first ``view_texts`` texts: the attribution comparison (with ``target``), the
   erasure tests of its sources (with ``faithfulness``), their attention maps (the
   comparison's own maps with ``generate``: prompt + generated tokens) and the perturbation
   run (with ``perturb``);
4. on the first ``causal_texts`` texts (:mod:`attnprobe.report.causal`): for a pre-norm
   language model, the direct logit attribution of ``logit:next`` at every position and the
   composition scores (weights only); with ``corrupt``, the patching experiment ``patch``;
5. the page (:func:`~attnprobe.report.build`), which keeps these results in
   :attr:`Report.contents <attnprobe.report.page.Report.contents>`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from attnprobe.attribution.comparison import check_generation_target, compare
from attnprobe.attribution.comparison_options import ComparisonOptions
from attnprobe.attribution.view_common import check_query
from attnprobe.capture.corpus import extract
from attnprobe.capture.generation import check_generation
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.metric import default_positions
from attnprobe.errors import InputError
from attnprobe.faithfulness.evaluate import evaluate
from attnprobe.heads.census_options import CensusOptions
from attnprobe.heads.head_census import census
from attnprobe.inputs.prepared import prepare
from attnprobe.inputs.text import Text
from attnprobe.inputs.token_ids import check_inputs
from attnprobe.perturb.experiments import reads_target, run
from attnprobe.report.causal import PatchRequest, causal_results, check_patching
from attnprobe.report.page import Report, build
from attnprobe.report.report_options import REPORT_FIELDS, ReportOptions
from attnprobe.types import AttentionMap

__all__ = ["REPORT_METHODS", "REPORT_VIEWS", "from_model"]

# what the comparison section sets side by side: gradient, perturbation and attention views
REPORT_METHODS = ("integrated_gradients", "saliency", "leave_one_out")
REPORT_VIEWS = ("raw", "rollout")


def from_model(model: nn.Module, tokenizer: Any, texts: Sequence[Text] | str,
               options: ReportOptions | None = None, *, corpus: CorpusOptions | None = None,
               **keywords: Any) -> Report:
    """Analyse ``model`` on ``texts`` and build the report page (``attnprobe report``).

    The texts are prepared once (:func:`~attnprobe.inputs.prepared.prepare`: their token
    rows, the model's length limit, the tokenizer's token classes) and that one object is
    handed to the census, the views, the comparison and the causal sections.

    Args:
        model / tokenizer: any model the census reads (``ap.load_model``) and its tokenizer.
        texts: the corpus (strings or token ids); the census covers every text, the views
            the first ``view_texts``.
        options: what the page holds (:class:`~attnprobe.report.report_options.
            ReportOptions`: ``syntax``, ``view_texts``, ``target``, ``n_steps``,
            ``faithfulness``, ``query``,
            ``perturb`` and ``perturb_options``, ``generate`` and ``sample``,
            ``logit_attribution``, ``composition``, ``causal_texts``, ``corrupt``,
            ``patch`` and ``patch_options``, ``metric`` and ``metric_positions``,
            ``title``).
        corpus / keywords: the corpus options (:class:`~attnprobe.core.corpus_options.
            CorpusOptions`: scope, batch size, truncation, seed, progress, distributed,
            max length), for the census; the view texts are cut to the model's limit
            (``max_length``) rather than refused, without a progress bar. ``keywords`` are
            corpus options and report options by name (``batch_size=8``,
            ``target="next-token"`` ...).

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
    given, own = CorpusOptions.split(keywords)
    walk = CorpusOptions.merged(corpus, given, own=REPORT_FIELDS, owner="from_model()")
    opts = (options or ReportOptions()).with_keywords(own)
    _check_early(model, opts)
    prepared = prepare(model, tokenizer, check_inputs(texts))  # the one-line input errors
    patching = _patch_request(model, tokenizer, prepared, opts, walk)
    found = census(model, tokenizer, prepared, options=CensusOptions(syntax=opts.syntax),
                   corpus=walk)
    shown = prepared.head(opts.view_texts)
    quiet = walk.replace(progress=False, truncation="cut")
    comparison = None
    if opts.target is not None:
        comparison = compare(model, tokenizer, shown, opts.target, methods=list(REPORT_METHODS),
                             views=list(REPORT_VIEWS), corpus=quiet,
                             options=ComparisonOptions(query=opts.query, n_steps=opts.n_steps,
                                                       generate=opts.generate,
                                                       sample=opts.sample))
    faithful = None
    if opts.faithfulness:  # the comparison's sources, tested on the same texts
        faithful = evaluate(model, tokenizer, shown, opts.target, methods=list(REPORT_METHODS),
                            views=list(REPORT_VIEWS), corpus=quiet.replace(batch_size=None),
                            query=opts.query, n_steps=opts.n_steps)
    maps = _view_maps(model, tokenizer, shown, comparison, opts, quiet)
    perturbation = None
    if opts.perturb is not None:
        extra = dict(opts.perturb_options or {})
        # target is for the attributions; the perturbation gets it only if it reads one
        reads = opts.target is not None and reads_target(opts.perturb, **extra)
        perturbation = run(model, tokenizer, shown, opts.perturb,
                           target=opts.target if reads else None, corpus=quiet, **extra)
    causal = causal_results(model, tokenizer, prepared, dla=opts.logit_attribution,
                            compose=opts.composition, patching=patching,
                            causal_texts=opts.causal_texts, corpus=quiet)
    # every relation: the page leaves out the rare ones and says how many
    return build(maps=maps, census=found, syntax=found.syntax(1) if opts.syntax else None,
                 comparison=comparison, perturbation=perturbation, title=opts.title,
                 logit_attribution=causal.logit_attribution, composition=causal.composition,
                 patching=causal.patching, faithfulness=faithful)


def _patch_request(model: nn.Module, tokenizer: Any, texts: Sequence[Text],
                   opts: ReportOptions, walk: CorpusOptions) -> PatchRequest | None:
    """The patching section's request (None without ``corrupt``), checked before any
    forward."""
    if opts.corrupt is None:
        return None
    corrupt = opts.corrupt
    where = default_positions(opts.metric) if opts.metric_positions is None \
        else opts.metric_positions
    request = PatchRequest(tuple([corrupt] if isinstance(corrupt, str) else corrupt),
                           opts.patch, dict(opts.patch_options or {}), opts.metric, where)
    check_patching(model, tokenizer, texts, request, causal_texts=opts.causal_texts,
                   max_length=walk.max_length)
    return request


def _check_early(model: nn.Module, opts: ReportOptions) -> None:
    """Refuse a bad ``query``, an unknown experiment or option, or a ``generate`` the model
    or the target cannot take, before the census runs."""
    check_query(opts.query)  # type: ignore[arg-type]
    if opts.faithfulness and (opts.target is None or opts.generate is not None):
        raise InputError("faithfulness tests the sources that explain target on the texts "
                         "as given: pass target=, without generate")
    if opts.perturb is not None:
        reads_target(opts.perturb, **dict(opts.perturb_options or {}))  # unknown or bad
    if opts.generate is None:
        return
    if opts.target is not None:
        check_generation_target(model, opts.target, None, opts.generate)
    else:
        check_generation(model, opts.generate)


def _view_maps(model: nn.Module, tokenizer: Any, shown: Sequence[Text], comparison: Any,
               opts: ReportOptions, quiet: CorpusOptions) -> list[AttentionMap]:
    """The attention view's maps: with ``generate`` and a target, the generations that were
    explained (the comparison's maps); else the view texts extracted."""
    if comparison is not None and comparison.maps:
        return list(comparison.maps)
    if opts.generate is None:
        return extract(model, tokenizer, shown, corpus=quiet)
    return extract(model, tokenizer, shown, generate=opts.generate, sample=opts.sample,
                   corpus=quiet)
