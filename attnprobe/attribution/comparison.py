"""Do the attention weights agree with what the gradients say matters?

:func:`compare` computes, for every text, importance from the attention (raw rows, rollout,
flow, attention × gradient, norms; per layer) and from attribution methods (Integrated
Gradients, saliency, input × gradient, GradientSHAP, leave-one-out ...) for one explicit
target, then scores every (attention view, method) pair and every pair of methods with rank
and distribution agreement metrics — and, when the decisive tokens are known, every source
against that ground truth. Everything comes back as tidy tables.

With ``generate=N`` (causal language models) each text is a prompt: it is continued by ``N``
tokens (:mod:`attnprobe.capture.generation`), and every generated token is explained from its
context — the prompt and the tokens generated before it — as inseq does: the methods
attribute the logit of the token that was generated, the views read the row that generated
it (the last row of the context, ``query="auto"``) off the one map of the generation (for
causal attention the context's rows of that map are exactly the context's own map).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import pandas as pd
import torch
from torch import nn

from attnprobe.attribution.attribution_options import AttributionOptions
from attnprobe.attribution.comparison_options import COMPARISON_FIELDS, ComparisonOptions
from attnprobe.attribution.comparison_result import (
    AGREEMENT_COLUMNS,
    STEP_COLUMNS,
    TRUTH_COLUMNS,
    Comparison,
    split_source,
)
from attnprobe.attribution.methods import attribute_inputs
from attnprobe.attribution.metrics import agreement, truth_scores
from attnprobe.attribution.targets import parse_target, refixed
from attnprobe.attribution.view_base import View, ViewInput
from attnprobe.attribution.view_common import check_query, prefix_map
from attnprobe.attribution.views import build_views, run_views
from attnprobe.capture.generation import check_generation, generate_maps, generation_corpus
from attnprobe.capture.info import model_scope
from attnprobe.core.checks import check_positive_ints
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.distributed import rank_and_world, run_sharded
from attnprobe.core.progress import StepBar
from attnprobe.core.scope import Scope
from attnprobe.core.tokens import special_tokens
from attnprobe.errors import InputError
from attnprobe.inputs.prepared import PreparedCorpus, prepare
from attnprobe.inputs.text import Text
from attnprobe.types import TokenAttribution

__all__ = ["AGREEMENT_COLUMNS", "DEFAULT_METHODS", "DEFAULT_VIEWS", "STEP_COLUMNS",
           "TRUTH_COLUMNS", "Comparison", "check_generation_target", "compare"]

DEFAULT_METHODS = ("integrated_gradients", "saliency", "input_x_gradient", "leave_one_out")
DEFAULT_VIEWS = ("raw", "rollout", "attn_x_grad", "norm")


def _truth_mask(truth: Sequence[bool] | torch.Tensor, tokens: tuple[str, ...],
                keep: torch.Tensor, example: str) -> torch.Tensor:
    """Truth over every token, from a mask over every token or over the kept ones."""
    truth = torch.as_tensor(truth, dtype=torch.bool).flatten()
    if len(truth) == len(tokens):
        return truth
    if len(truth) == int(keep.sum()):
        full = torch.zeros(len(tokens), dtype=torch.bool)
        full[keep] = truth
        return full
    raise InputError(f"example {example}: truth has {len(truth)} entries but the text has "
                     f"{len(tokens)} tokens ({int(keep.sum())} without special tokens)")


def _rows(example: str, source: TokenAttribution, kind: str, reference: TokenAttribution,
          keep: torch.Tensor, top_k: int | None) -> list[tuple]:
    view, layer = split_source(source.method)
    scores = agreement(source, reference, k=top_k, keep=keep)
    return [(example, source.method, kind, view, layer, reference.method, metric, value, p)
            for metric, (value, p) in scores.items()]


@dataclass(frozen=True)
class _Job:
    """What every text of one comparison shares."""

    model: nn.Module
    tokenizer: Any
    target: Any
    methods: tuple[str, ...]
    views: tuple[View, ...]
    scope: Scope
    query: str | int
    top_k: int | None
    special: frozenset[str]
    corpus: CorpusOptions  # what each attribution is given (one text, this process)
    options: AttributionOptions
    prepared: PreparedCorpus
    generate: int = 0  # tokens to generate and explain (0: explain the texts as they are)
    sample: bool = False


def _agreement(job: _Job, example: str, found: list[TokenAttribution],
               seen: list[TokenAttribution], truth: Any) -> tuple[list, list]:
    """Agreement rows and truth rows of one example from its attributions (magnitudes) and
    attention views, all over the same tokens."""
    tokens = found[0].tokens
    if any(v.tokens != tokens for v in seen):
        raise InputError(f"example {example}: the attention views and the attributions "
                         "tokenised the text differently")
    keep = torch.tensor([t not in job.special for t in tokens])
    if int(keep.sum()) < 2:
        raise InputError(f"example {example}: fewer than two tokens to compare")
    agreement_rows: list[tuple] = []
    for view in seen:
        for reference in found:
            agreement_rows += _rows(example, view, "attention", reference, keep, job.top_k)
    for a, first in enumerate(found):
        for reference in found[a + 1:]:
            agreement_rows += _rows(example, first, "attribution", reference, keep, job.top_k)
    truth_rows: list[tuple] = []
    if truth is not None:
        mask = _truth_mask(truth, tokens, keep, example)
        for source, kind in [*((v, "attention") for v in seen),
                             *((m, "attribution") for m in found)]:
            view, layer = split_source(source.method)
            for metric, value in truth_scores(source.scores[keep], mask[keep]).items():
                truth_rows.append((example, source.method, kind, view, layer, metric, value))
    return agreement_rows, truth_rows


def _magnitudes(found: list[TokenAttribution], example: str) -> list[TokenAttribution]:
    # importance is the magnitude: a token that pushes the output down matters too
    # (Jain & Wallace sum |gradient|; Abnar & Zuidema take |Σ_d ∂y/∂e|)
    return [TokenAttribution(a.scores.abs(), a.tokens, a.method, a.target, example, a.delta)
            for a in found]


def _one_text(job: _Job, bar: StepBar, item: tuple[str, Text, Any]
              ) -> tuple[list, list, list, list]:
    """Agreement rows, truth rows and every importance vector of one text or token ids (and
    no map); ``bar`` advances per method and once for the attention views."""
    example, _, truth = item

    def on_method(_: str, name: str) -> None:  # the bar names the running method
        bar.begin(f"text {example}: {name}")

    # the text is encoded once, from the prepared rows, for the methods and the views
    given = job.prepared.inputs([int(example)], truncation=job.corpus.truncation,
                                max_length=job.corpus.max_length)
    found = attribute_inputs(job.model, job.tokenizer, [given], job.target, job.methods,
                             example_ids=[example], on_method=on_method, options=job.options,
                             corpus=job.corpus)
    found = _magnitudes(found, example)
    fixed = refixed(job.target, found[0].target, job.model, job.tokenizer)
    if job.views:
        bar.begin(f"text {example}: attention views")
    seen = run_views(job.views, ViewInput(
        "", job.scope, job.query, fixed, example, job.model, job.tokenizer,
        job.corpus.truncation, job.corpus.max_length, inputs=given)) if job.views else []
    agreement_rows, truth_rows = _agreement(job, example, found, seen, truth)
    return agreement_rows, truth_rows, [*found, *seen], []


def _one_generation(job: _Job, bar: StepBar, item: tuple[str, str, Any]
                    ) -> tuple[list, list, list, list]:
    """Continue one text by ``job.generate`` tokens, then explain each generated token from
    its context (the prompt and the tokens generated before it): agreement rows prefixed by
    ``(step, position, token)``, every importance vector, and the generation's map. ``bar``
    advances for the generation, then per generated token and method (and views)."""
    example, text, _ = item
    bar.begin(f"text {example}: generating")
    gen = generate_maps(job.model, job.tokenizer, [text], job.generate, sample=job.sample,
                        corpus=job.corpus)[0]
    amap = replace(gen.amap, example_id=example)
    rows: list[tuple] = []
    vectors: list[TokenAttribution] = []
    for step in range(1, job.generate + 1):
        position = gen.prompt_length + step - 1  # of the generated token in the sequence
        token_id = int(gen.ids[position])
        context = {"input_ids": gen.ids[None, :position],
                   "attention_mask": torch.ones(1, position, dtype=torch.long)}
        name = f"{example}:step{step}"
        target = parse_target(f"next-token:{token_id}", job.model, job.tokenizer)
        found = _magnitudes(attribute_inputs(
            job.model, job.tokenizer, [context], target, job.methods, example_ids=[name],
            on_method=lambda _, method, step=step: bar.begin(
                f"text {example} token {step}: {method}"), options=job.options,
            corpus=job.corpus), name)
        if job.views:
            bar.begin(f"text {example} token {step}: attention views")
        seen = run_views(job.views, ViewInput(
            "", job.scope, job.query, target, name, job.model, job.tokenizer,
            given_map=prefix_map(amap, position), inputs=context)) if job.views else []
        agreement_rows, _ = _agreement(job, example, found, seen, None)
        token = amap.readable_tokens()[position]
        rows += [(r[0], step, position, token, *r[1:]) for r in agreement_rows]
        vectors += [*found, *seen]
    return rows, [], vectors, [amap]


def compare(model: nn.Module, tokenizer: Any, texts: Sequence[Text] | str, target: Any, *,
            methods: Sequence[str] = DEFAULT_METHODS,
            views: Sequence[str | View] | str | View | None = DEFAULT_VIEWS,
            truth: Sequence[Sequence[bool]] | None = None,
            options: ComparisonOptions | None = None, corpus: CorpusOptions | None = None,
            **keywords: Any) -> Comparison:
    """Compare attention-derived importance with attribution methods, text by text.

    Args:
        texts: the inputs (one example each).
        target: what is explained — a spec such as ``"class:1"``, ``"next-token"``,
            ``"similarity:A cat sits."`` (see :mod:`attnprobe.attribution.targets`), or a
            callable ``(output, inputs) -> Tensor[batch]``.
        methods: attribution methods (:data:`attnprobe.attribution.methods.METHODS`).
        views: attention views (names in :data:`attnprobe.attribution.views.VIEWS` or
            :class:`~attnprobe.attribution.view_base.View` objects; ``None``: every registered
            view; empty: compare the methods with each other only). The default,
            :data:`DEFAULT_VIEWS`, leaves out a view the model cannot serve (``norm`` on a
            model type it cannot slice); a view named by the caller is checked.
        truth: per text, which tokens decide the output (over all tokens, or over the
            non-special ones); adds precision@k, mass and AUROC per source.
        options: the comparison's own options (:class:`~attnprobe.attribution.
            comparison_options.ComparisonOptions`): ``query``, the row the views read;
            ``top_k``; ``drop_special``; ``n_steps``; ``generate``, continue each text by
            this many tokens (a causal language model; target ``"next-token"``) and explain
            every generated token (module docstring; the table then has ``STEP_COLUMNS``);
            ``sample``.
        corpus / keywords: the corpus options (:class:`~attnprobe.core.corpus_options.
            CorpusOptions`, or its fields by name) and the comparison options by name
            (``query="last"``, ``n_steps=16`` ...): ``scope``, the layers whose attention
            views are reported (and the heads ``raw`` and ``norm`` average; rollout, flow
            and attention × gradient always run through every head of every layer, as they
            are defined); ``batch_size``, perturbed copies per forward (leave-one-out,
            occlusion); ``truncation``, ``"error"``, ``"cut"`` or ``"skip"`` for texts longer
            than the model allows (or than ``max_length``; skipped texts are listed in
            :attr:`Comparison.skipped`, cut ones are cut alike for every view and method);
            ``seed``, the random methods (GradientSHAP) and ``sample``; ``progress``, a bar
            over the steps (each attribution method on each text, then the text's attention
            views; it names the running one); ``distributed``, split the texts over the
            ranks of an initialised ``torch.distributed`` group and gather the tables on
            every rank (default: when a group is initialised).

    Attribution scores are compared by magnitude (``|score|``, as Jain & Wallace and Abnar &
    Zuidema do); :attr:`Comparison.attributions` holds those magnitudes. For signed scores
    call :func:`attnprobe.attribution.methods.attribute` directly.

    Returns:
        A :class:`Comparison` (``.table``, ``.summary()``, ``.truth_table``,
        ``.truth_summary()``); ``example_id`` is the text's index in ``texts``.

    Example:
        >>> c = compare(lm, lm_tok, [prompt], "next-token", methods=["saliency"],
        ...             views=["raw"])
        >>> c.table.columns.tolist()
        ['example_id', 'source', 'source_kind', 'view', 'layer', 'method', 'metric', 'value',
         'p_value']
        >>> sorted(c.table["source"].unique()), sorted(c.table["metric"].unique())
        (['raw@L0', 'raw@L1'], ['jsd', 'kendall_tau', 'spearman', 'topk_overlap'])
        >>> c.summary()
    """
    given, own = CorpusOptions.split(keywords)
    walk = CorpusOptions.merged(corpus, given, own=COMPARISON_FIELDS, owner="compare()")
    opts = (options or ComparisonOptions()).with_keywords(own)
    generate, query = opts.generate, opts.query
    check_positive_ints("compare", n_steps=opts.n_steps, top_k=opts.top_k)
    check_query(query)
    prepared = prepare(model, tokenizer, texts)
    if generate is not None:
        check_generation_target(model, target, truth, generate)
        found, _ = generation_corpus(model, tokenizer, prepared, generate,
                                     truncation=walk.truncation, max_length=walk.max_length)
    else:
        found = prepared.corpus(truncation=walk.truncation, max_length=walk.max_length)
    n_texts = len(found.ids) + len(found.skipped)
    if truth is not None and len(truth) != n_texts:
        raise InputError(f"truth has {len(truth)} entries for {n_texts} texts")
    if isinstance(methods, str):
        methods = [methods]
    if not methods:
        raise InputError("give at least one attribution method to compare with")
    empty = views is not None and not isinstance(views, (str, View)) and len(views) == 0
    defaults = not isinstance(views, (str, View)) and views is not None \
        and tuple(views) == DEFAULT_VIEWS  # the defaults adapt to the model; a choice does not
    built = [] if empty else build_views(views, model=model, only_readable=defaults)
    # the corpus already left the long texts out: a text left is cut or fits
    each = walk.replace(batch_size=walk.batch(), progress=False, distributed=False,
                        truncation="cut" if walk.truncation_mode == "cut" else "error")
    job = _Job(model, tokenizer, parse_target(target, model, tokenizer), tuple(methods),
               tuple(built), model_scope(model, walk.scope), query, opts.top_k,
               frozenset(special_tokens(tokenizer)) if opts.drop_special else frozenset(),
               each, AttributionOptions(n_steps=opts.n_steps), prepared,
               generate=generate or 0, sample=bool(opts.sample))
    items = [(example, text, None if truth is None else truth[int(example)])
             for example, text in zip(found.ids, found.texts, strict=True)]
    one = _one_generation if generate else _one_text
    # the bar counts steps, not texts: each method on each text (and the views), so that it
    # moves during Integrated Gradients, which takes most of the time
    rank, world = rank_and_world(walk.distributed)
    steps = len(methods) + (1 if built else 0)
    per_text = 1 + job.generate * steps if generate else steps
    with StepBar(enabled=walk.progress, desc="compare", total=len(items[rank::world]) * per_text,
                 rank=rank) as bar:
        parts = run_sharded(partial(one, job, bar), items, distributed=walk.distributed)
    columns = STEP_COLUMNS if generate else AGREEMENT_COLUMNS
    table = pd.DataFrame([r for part in parts for r in part[0]], columns=list(columns))
    truth_table = pd.DataFrame([r for part in parts for r in part[1]],
                               columns=list(TRUTH_COLUMNS))
    for frame in (table, truth_table):  # model layer index; <NA> for methods and attn_x_grad
        frame["layer"] = frame["layer"].astype("Int64")
    return Comparison(table, truth_table, [a for part in parts for a in part[2]],
                      skipped=found.skipped, maps=[m for part in parts for m in part[3]])


def check_generation_target(model: nn.Module, target: Any, truth: Any, generate: int) -> None:
    """With ``generate``, what is explained is each generated token: refuse anything else
    (and a model that cannot generate) before any forward."""
    check_generation(model, generate)
    spec = target.strip().lower() if isinstance(target, str) else None
    if spec != "next-token":
        raise InputError(f"generate explains each generated token: give target 'next-token' "
                         f"(got {target if isinstance(target, str) else type(target).__name__!r})")
    if truth is not None:
        raise InputError("truth marks tokens of the texts; it cannot be combined with generate")
