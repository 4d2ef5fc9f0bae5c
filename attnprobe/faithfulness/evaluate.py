"""Which explanation does the model itself agree with? Erasure tests of every attention view
and attribution method, side by side, on the same inputs and removal procedure.

:func:`evaluate` computes each source's importance once per text (attribution methods,
attention views and the new attention-based views value zeroing and ALTI,
:mod:`attnprobe.faithfulness.sources`), removes tokens in the order each source ranks them
(:mod:`attnprobe.faithfulness.removal`), and measures how the explained output moves
(:mod:`attnprobe.faithfulness.metrics`): comprehensiveness and sufficiency at each removal
level and their AOPC (DeYoung et al. 2020), the deletion and insertion curves and the area
between them (ABPC), and Kendall τ with leave-one-out (as ferret reports it), against a
random-order baseline under the same removal. Every distinct perturbed input of a group of
texts — all sources, levels and curve points — runs through the model once, in padded
batches (:mod:`attnprobe.faithfulness.plan`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from attnprobe.attribution.attribution_options import AttributionOptions
from attnprobe.attribution.methods import DEFAULT_BUDGET
from attnprobe.attribution.targets import Target, parse_target
from attnprobe.attribution.view_base import View
from attnprobe.attribution.views import build_views
from attnprobe.capture.info import attention_sizes, causal_of, model_scope
from attnprobe.core.checks import check_eval
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.distributed import rank_and_world, run_sharded
from attnprobe.core.progress import StepBar
from attnprobe.core.tokens import special_ids
from attnprobe.errors import InputError
from attnprobe.faithfulness.metrics import removal_counts
from attnprobe.faithfulness.options import (
    DEFAULT_METHODS,
    DEFAULT_VIEWS,
    FAITHFULNESS_FIELDS,
    FaithfulnessOptions,
)
from attnprobe.faithfulness.plan import CURVES, Design, InputPool, plan_text, score_text
from attnprobe.faithfulness.removal import pad_batch, removal_for
from attnprobe.faithfulness.result import (
    CURVE_COLUMNS,
    SANITY_COLUMNS,
    TABLE_COLUMNS,
    Faithfulness,
)
from attnprobe.faithfulness.sanity import randomized_copy, sanity_rows
from attnprobe.faithfulness.sources import (
    SourceJob,
    explain_text,
    guarded_target,
    source_kind,
)
from attnprobe.inputs.prepared import PreparedCorpus, prepare
from attnprobe.inputs.text import Text, model_inputs

__all__ = ["GROUP_TEXTS", "PASS_TOKENS", "evaluate"]

GROUP_TEXTS = 16  # texts whose perturbed inputs are pooled (deduplicated) and run together
PASS_TOKENS = 8192  # tokens per forward when no batch_size is given


@dataclass(frozen=True)
class _Run:
    """What every group of texts shares."""

    job: SourceJob
    random_job: SourceJob | None
    prepared: PreparedCorpus
    corpus: CorpusOptions
    options: FaithfulnessOptions
    design: Design
    special: frozenset[int]
    causal: bool
    pad_id: int
    n_sources: int  # at most, for the budget check before any source runs


def _special(run: _Run, ids: torch.Tensor) -> np.ndarray:
    """``[seq]`` positions never removed: special tokens and, for a causal model, the last
    position (the prediction is read there; removing it changes what is explained)."""
    special = np.array([int(i) in run.special for i in ids.tolist()], dtype=bool)
    if run.causal:
        special[-1] = True
    return special


def _check_budget(run: _Run, example: str, n_tokens: int, n_real: int, n_sources: int) -> None:
    """Refuse a text whose perturbed inputs would cost more token-forwards than the budget."""
    opts = run.options
    points = (opts.curve_steps if opts.curve_steps is not None else n_real) + 1
    rows = 1 + n_real + (n_sources + 1) * (2 * len(opts.levels) + len(CURVES) * points)
    budget = run.corpus.budget or DEFAULT_BUDGET
    if rows * n_tokens > budget:
        raise InputError(f"the faithfulness tests of text {example} would run {rows:,} inputs "
                         f"of up to {n_tokens} tokens ({rows * n_tokens:,} token-forwards), "
                         f"over budget={budget:,}: lower curve_steps, give fewer levels or "
                         "sources, shorten the text (max_length=, truncation='cut') or raise "
                         "budget")


def _run_pool(model: nn.Module, pool: InputPool, targets: Sequence[Target], pad_id: int,
              batch_size: int | None) -> np.ndarray:
    """The explained output of every pooled input, ``[len(pool)]`` float64: inputs sorted by
    length, longest first, right-padded, ``batch_size`` rows (or about :data:`PASS_TOKENS`
    tokens) per forward; each row read by its own text's target. A callable target gets
    inputs of one length per forward (it may read a position, ``logits[:, -1]``, that
    padding would move)."""
    order = sorted(range(len(pool)), key=lambda i: -pool.items[i].input_ids.numel())
    unpadded = any(t.spec == "custom" for t in targets)
    out = np.full(len(pool), np.nan)
    start = 0
    with torch.no_grad():
        while start < len(order):
            width = pool.items[order[start]].input_ids.numel()
            size = batch_size or max(1, PASS_TOKENS // max(width, 1))
            chunk = order[start:start + size]
            if unpadded:  # sorted by length: the inputs of the first one's width lead
                chunk = [i for i in chunk if pool.items[i].input_ids.numel() == width]
            # longest first: the chunk's first input sets its width
            ids, mask = pad_batch([pool.items[i] for i in chunk], pad_id)
            inputs = model_inputs(model, {"input_ids": ids, "attention_mask": mask})
            output = model(**inputs)
            for t in sorted({pool.targets[i] for i in chunk}):
                rows = [r for r, i in enumerate(chunk) if pool.targets[i] == t]
                values = targets[t](output, inputs).detach().to("cpu", torch.float64)
                out[[chunk[r] for r in rows]] = values[rows].numpy()
            start += len(chunk)
    return out


def _one_group(run: _Run, bar: StepBar, group: Sequence[str]
               ) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """Table, curve and sanity rows of a group of texts (their inputs pooled)."""
    pool, targets, plans = InputPool(), [], []
    shared: dict[object, int] = {}
    sanity: list[tuple] = []
    opts, walk = run.options, run.corpus
    for example in group:
        bar.begin(f"text {example}")
        given = run.prepared.inputs([int(example)], truncation=walk.truncation,
                                    max_length=walk.max_length)
        ids = given["input_ids"][0].cpu()
        special = _special(run, ids)
        # refused before the text's explanations are paid for
        _check_budget(run, example, len(ids), int((~special).sum()), run.n_sources)
        found, fixed = explain_text(run.job, example, given)
        # texts whose fixed targets are the same (class:1, next-token:464) share inputs
        key = fixed.spec if fixed.spec != "custom" else id(fixed)
        if key not in shared:
            shared[key] = len(targets)
            targets.append(fixed)
        sources = [(a.method, source_kind(run.job.method_names, a.method), a.scores.numpy())
                   for a in found]
        plans.append(plan_text(example, ids, special, sources, run.design, pool, shared[key],
                               target_spec=fixed.spec, seed=walk.seed + int(example)))
        if run.random_job is not None:
            bar.begin(f"text {example}: randomised model")
            # the copy explains the same output (next-token: the model's token, not the
            # copy's own top one)
            again, _ = explain_text(replace(run.random_job, target=fixed), example, given)
            sanity += sanity_rows(example, found, again, special, run.job.method_names)
    outputs = pool.outputs_with_undefined(
        _run_pool(run.job.model, pool, targets, run.pad_id, walk.batch_size))
    rows: list[tuple] = []
    curves: list[tuple] = []
    for plan in plans:
        table, curve = score_text(plan, outputs, opts.levels, run.design.removal.label)
        rows += table
        curves += curve
    return rows, curves, sanity


def _methods(methods: Any) -> tuple[Any, ...]:
    """The methods as a tuple, refused when not a sequence or when a name repeats (its rows
    would be one source counted twice in every mean)."""
    if isinstance(methods, str):
        return (methods,)
    if methods is None or not isinstance(methods, Sequence):
        raise InputError(f"methods must be a list of method names or objects (empty: none); "
                         f"got {methods!r}")
    names = [str(getattr(m, "name", m)) for m in methods]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InputError(f"method {', '.join(map(repr, repeated))} is given twice: each "
                         "source is scored once")
    return tuple(methods)


def _views(views: Any, model: nn.Module) -> tuple[View, ...]:
    if views is not None and not isinstance(views, (str, View)) and len(views) == 0:
        return ()
    # the defaults and "every view" adapt to the model; a view the caller names does not
    defaults = views is None or (not isinstance(views, (str, View))
                                 and tuple(views) == DEFAULT_VIEWS)
    return tuple(build_views(views, model=model, only_readable=defaults))


def _view_layers(model: nn.Module, scope: Any, last_layer: int | None) -> int:
    """Sources one view gives at most: one at the last layer, else one per scope layer."""
    if last_layer is not None:
        return 1
    return sum(1 for layer in range(attention_sizes(model)[0]) if scope.wants_layer(layer))


def _last_layer(model: nn.Module, scope: Any, opts: FaithfulnessOptions) -> int | None:
    if opts.view_layers != "last":
        return None
    layers = [layer for layer in range(attention_sizes(model)[0]) if scope.wants_layer(layer)]
    return max(layers) if layers else None


def evaluate(model: nn.Module, tokenizer: Any, texts: Sequence[Text] | str, target: Any, *,
             methods: Sequence[Any] = DEFAULT_METHODS,
             views: Sequence[str | View] | str | View | None = DEFAULT_VIEWS,
             options: FaithfulnessOptions | None = None, corpus: CorpusOptions | None = None,
             **keywords: Any) -> Faithfulness:
    """Erasure tests of attention views and attribution methods, text by text.

    Args:
        texts: the inputs (one example each).
        target: what is explained, as in :func:`~attnprobe.compare`: ``"class:K"``,
            ``"prob:K"``, ``"next-token"`` (fixed per text on the unperturbed input),
            ``"similarity:TEXT"``, or a callable ``(output, inputs) -> Tensor[batch]``.
        methods: attribution methods (names in :data:`~attnprobe.attribution.method_base.
            METHODS` or method objects; empty: none).
        views: attention views (:data:`~attnprobe.attribution.view_base.VIEWS`; ``None``:
            every registered one the model can serve; empty: none). The default,
            :data:`~attnprobe.faithfulness.options.DEFAULT_VIEWS`, also leaves out a view the
            model cannot serve; a view named by the caller is checked.
        options: the evaluation's own options (:class:`~attnprobe.faithfulness.options.
            FaithfulnessOptions`: ``levels``, ``removal``, ``fill``, ``curve_steps``,
            ``view_layers``, ``magnitude``, ``query``, ``n_steps``, ``sanity``,
            ``randomize``, ``sanity_threshold``).
        corpus / keywords: the corpus options (or their fields by name) and the evaluation's
            options by name (``levels=(0.1, 0.2)``, ``removal="replace"`` ...): ``scope``,
            the layers the views are read at (with ``view_layers="last"``, the last of them);
            ``batch_size``, perturbed inputs per forward (default about
            :data:`PASS_TOKENS` tokens); ``max_length`` / ``truncation`` as in
            :func:`~attnprobe.extract`; ``seed``, the random baseline (text ``i`` uses
            ``seed + i``) and GradientSHAP; ``budget``, the most token-forwards the tests of
            one text (and each method on it) may cost; ``progress``, a bar over the texts;
            ``distributed``, split the texts over the ranks of an initialised
            ``torch.distributed`` group.

    Returns:
        A :class:`~attnprobe.faithfulness.result.Faithfulness` (``.table``, ``.summary()``,
        ``.curves()``); ``example_id`` is the text's index in ``texts``.

    Raises:
        InputError: a model in training mode, inside ``torch.inference_mode()``, an unknown
            method, view or removal, a method named twice, a removal the tokenizer cannot do
            (``replace`` without a mask, pad or unk token), a bad or repeated level,
            ``randomize`` without ``sanity``, a callable target that raises, or a text over
            ``budget``.

    Example:
        >>> result = evaluate(model, tok, texts, "similarity:A kitten sleeps.",
        ...                   methods=["saliency"], views=["raw"], levels=(0.2, 0.5))
        >>> sorted(result.table["source"].unique())          # MiniLM's last layer is 5
        ['random', 'raw@L5', 'saliency']
        >>> result.summary()[["source", "aopc_comprehensiveness", "rank"]]
    """
    given, own = CorpusOptions.split(keywords)
    walk = CorpusOptions.merged(corpus, given, own=FAITHFULNESS_FIELDS,
                                owner="faithfulness.evaluate()")
    opts = (options or FaithfulnessOptions()).with_keywords(own)
    check_eval(model)
    if torch.is_inference_mode_enabled():
        raise InputError("faithfulness needs gradients for its methods: call it outside "
                         "torch.inference_mode()")
    removal_counts(100, opts.levels)  # a bad level is refused before any forward
    removal = removal_for(tokenizer, opts.removal, opts.fill)
    methods = _methods(methods)
    if opts.randomize is not None and not opts.sanity:
        raise InputError("randomize applies to the sanity check: add sanity=True")
    built = _views(views, model)
    if not methods and not built:
        raise InputError("give at least one attribution method or attention view to test")
    prepared = prepare(model, tokenizer, texts)
    found = prepared.corpus(truncation=walk.truncation, max_length=walk.max_length)
    scope = model_scope(model, walk.scope)
    each = walk.replace(progress=False, distributed=False,
                        truncation="cut" if walk.truncation_mode == "cut" else "error")
    explained = parse_target(guarded_target(target), model, tokenizer)
    job = SourceJob(model, tokenizer, explained, methods, built, scope, opts.query,
                    _last_layer(model, scope, opts), opts.magnitude, each,
                    AttributionOptions(n_steps=opts.n_steps))
    random_job = job.on(randomized_copy(model, opts.randomize, seed=walk.seed)) \
        if opts.sanity else None
    pad_id = getattr(tokenizer, "pad_token_id", None)
    run = _Run(job, random_job, prepared, walk, opts,
               Design(removal, opts.levels, opts.curve_steps),
               frozenset(special_ids(tokenizer)), bool(causal_of(model)),
               0 if pad_id is None else int(pad_id),
               len(methods) + len(built) * _view_layers(model, scope, job.last_layer))
    rank, world = rank_and_world(walk.distributed)
    # every rank gets texts: groups of at most GROUP_TEXTS, at least one per rank
    size = max(1, min(GROUP_TEXTS, -(-len(found.ids) // world)))
    groups = [found.ids[i:i + size] for i in range(0, len(found.ids), size)]
    with StepBar(enabled=walk.progress, desc="faithfulness", rank=rank,
                 total=sum(len(g) for g in groups[rank::world])) as bar:
        parts = run_sharded(partial(_one_group, run, bar), groups,
                            distributed=walk.distributed)
    table = pd.DataFrame([r for part in parts for r in part[0]], columns=list(TABLE_COLUMNS))
    table["k"] = table["k"].astype("Int64")
    curves = pd.DataFrame([r for part in parts for r in part[1]], columns=list(CURVE_COLUMNS))
    sanity = pd.DataFrame([r for part in parts for r in part[2]], columns=list(SANITY_COLUMNS))
    return Faithfulness(table, curves, sanity, skipped=found.skipped,
                        sanity_threshold=opts.sanity_threshold, seed=walk.seed)

