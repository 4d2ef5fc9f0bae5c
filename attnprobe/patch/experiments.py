"""Patching experiments as tidy tables: ``run(model, tokenizer, clean, corrupt, metric,
experiment)`` and one function per experiment (:func:`heads`, :func:`path`,
:func:`attribution`).

The experiments — :data:`EXPERIMENTS`, discovered from the modules of :mod:`attnprobe.patch`
(each declares ``RANK`` and registers itself with a one-line summary) — with their options and
defaults are listed by ``attnprobe patch --help`` and by the README's generated table (``make
readme``); the module that registers one documents it (``heads`` in
:mod:`~attnprobe.patch.activation`, ``path`` in :mod:`~attnprobe.patch.paths` ...), and
:func:`params_of` gives its parameter dataclass, which also says what is particular to it
(the sites it reads, the options that replace ``scope``: :mod:`attnprobe.patch.params`).

Every experiment takes ``direction`` (``denoising``: the corrupted run patched with clean
activations, what is *sufficient*; ``noising``: the clean run patched with corrupted ones,
what is *necessary*), the corpus options (one
:class:`~attnprobe.core.corpus_options.CorpusOptions` or its keywords: ``scope``;
``batch_size``, rows per forward, examples × patches, examples for ``attribution``;
``truncation`` / ``max_length`` for texts longer than the model allows; ``seed``, though
patching draws nothing at random; ``progress``; ``distributed``, the work split over the
ranks of an initialised ``torch.distributed`` group, every rank returning the
single-process table) and the other keywords of :func:`run`. Tables:
:mod:`attnprobe.patch.table`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
from torch import nn

from attnprobe.capture.info import model_scope
from attnprobe.core.checks import check_eval
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.distributed import rank_and_world
from attnprobe.core.metric import Metric, MetricFn, Positions
from attnprobe.core.positions import fit_positions
from attnprobe.core.scope import Scope, ScopeLike
from attnprobe.errors import InputError
from attnprobe.patch.job import EXPERIMENTS, Job
from attnprobe.patch.pairs import MetricPlan, Pair, check_direction, prepare_pairs
from attnprobe.patch.params import Params
from attnprobe.patch.sites import check_served

__all__ = ["EXPERIMENTS", "SHARED", "attribution", "heads", "params_of", "path", "run"]

SHARED = ("scope", "batch_size", "truncation", "seed", "progress", "distributed",
          "max_length", "metric_positions", "pairs")
MetricLike = str | Metric | MetricFn


def params_of(experiment: str) -> type[Params]:
    """The parameter dataclass of ``experiment`` (its options, defaults and help).

    Example:
        >>> ap.patch.params_of("path")()  # the defaults: PathParams(receivers=None, ...)
    """
    return EXPERIMENTS.named(experiment).params


def _check_model(model: Any) -> None:
    if not isinstance(model, nn.Module):
        raise InputError(f"model must be a torch module; got {type(model).__name__}")
    check_eval(model)


def _checked(model: Any, experiment: str, params: Params, corpus: CorpusOptions) -> str:
    """What :func:`run` refuses before any forward (what the experiment's parameter class
    says it cannot take or the model cannot serve); returns the checked direction."""
    _check_model(model)
    direction = check_direction(params.direction)  # type: ignore[attr-defined]
    rank_and_world(corpus.distributed)  # distributed=True without a process group fails here
    refusal = params.scope_refusal(experiment, corpus.scope)
    if refusal is not None:
        raise InputError(refusal)
    check_served(model, params.sites(), f"patch {experiment}")
    return direction


def run(model: nn.Module, tokenizer: Any, clean: Any, corrupt: Any, metric: MetricLike,
        experiment: str = "heads", *, corpus: CorpusOptions | None = None,
        metric_positions: Positions = "last", pairs: Sequence[Pair] | None = None,
        **keywords: Any) -> pd.DataFrame:
    """Run one patching experiment over the pairs ``(clean[i], corrupt[i])`` (module
    docstring; :func:`heads`, :func:`path` and :func:`attribution` document each).

    Args:
        model / tokenizer: an attnprobe reference model or a transformers model, in eval
            mode, and its tokenizer (:mod:`attnprobe.patch.sites`: which models serve which
            sites).
        clean / corrupt: the inputs, strings or token ids; pair ``i`` must tokenize to one
            length (``example_id`` is ``i``).
        metric: a spec of :mod:`attnprobe.core.metric` (``"logit_diff:Paris,Rome"``,
            ``"logit:next"``, ``"loss"``, ``"next-token"`` — fixed on the clean run ...), a
            :class:`~attnprobe.core.metric.Metric` or a callable ``(output, batch) ->
            Tensor[batch]``.
        corpus: :class:`~attnprobe.core.corpus_options.CorpusOptions` (or its keywords,
            which override it; module docstring): ``scope`` (``path``: ``senders`` and
            ``receivers`` instead), ``batch_size`` (examples × patches per forward),
            ``truncation`` / ``max_length`` (``"cut"`` both inputs of a pair alike,
            ``"skip"`` the pair), ``progress``, ``distributed``; ``budget`` is refused.
        metric_positions: where a spec metric reads (``"last"``, ``"all"``, a position, a
            list, one list per example, or a bool mask ``[example, seq]`` as wide as the
            longest input; ``None``: the metric's default; :mod:`attnprobe.core.positions`).
        pairs: for ``metric="logit_diff"``, one ``(correct, wrong)`` pair per example.
        **keywords: the corpus options, and the experiment's options (:func:`params_of`).

    Returns:
        The tidy table of :mod:`attnprobe.patch.table` (a DataFrame with a notebook view).

    Raises:
        InputError: an unknown experiment or option, pairs of different lengths (the first
            is named), a metric equal on both runs of every example, a site the model's seam
            cannot serve, a bad scope, a model in training mode.

    Example:
        >>> model, tok = ap.load_model("ref:induction")
        >>> clean = ["t05 t11 t40 t03 t17 t42 t08 t55 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> corrupt = ["t60 t61 t62 t63 t01 t02 t04 t06 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> copies = list(range(9, 16))  # second-copy positions ([BOS] is position 0)
        >>> table = ap.patch.run(model, tok, clean, corrupt, "logit:next", "heads",
        ...                      metric_positions=copies, site="q", direction="noising")
    """
    given, options = CorpusOptions.split(keywords)
    corpus = CorpusOptions.merged(corpus, given)
    if corpus.budget is not None:
        raise InputError("patching takes no budget: batch_size sets the rows per forward")
    spec = EXPERIMENTS.named(experiment)
    params = spec.params.build(spec.name, options, SHARED)
    direction = _checked(model, spec.name, params, corpus)
    found = prepare_pairs(model, tokenizer, clean, corrupt, truncation=corpus.truncation,
                          max_length=corpus.max_length)
    metric_positions = fit_positions(metric_positions, found.input_lengths, "metric_positions")
    plan = MetricPlan(metric, tokenizer, metric_positions, pairs, found.n_inputs)
    job = Job(spec.name, model, tokenizer, found, plan, model_scope(model, corpus.scope),
              direction, params, corpus.batch(), corpus.progress, corpus.distributed)
    table = spec.fn(job)
    table.attrs["metric_ids"] = plan.token_ids
    return table


def heads(model: nn.Module, tokenizer: Any, clean: Any, corrupt: Any, metric: MetricLike, *,
          site: str = "output", positions: str = "all", direction: str = "denoising",
          per: str = "head", corpus: CorpusOptions | None = None,
          **keywords: Any) -> pd.DataFrame:
    """Activation patching of every scoped head
    ([causal methods](../guide/causal-methods.md#activation-patching); module
    :mod:`attnprobe.patch.activation`): the base run (corrupted when denoising, clean when
    noising) with one head's ``site`` taken from the other run — batched, one patch per batch
    row. ``corpus`` and the other keywords (``scope``, ``batch_size``, ``metric_positions``,
    ``pairs`` ...) are those of :func:`run`.

    Args:
        site: ``output`` (the per-head output z), ``pattern``, ``q``, ``k`` or ``v`` (``k``
            and ``v`` patch a key/value head of grouped-query models: ``head`` is then the
            key/value head).
        positions: ``"all"`` (every position at once) or ``"each"`` (one row per position;
            a position of ``k``/``v`` is a key, of the others a query).
        direction: ``"denoising"`` (sufficiency) or ``"noising"`` (necessity).
        per: ``"head"`` (each head alone), ``"layer"`` (each layer's scoped heads together)
            or ``"scope"`` (every scoped head at once).

    Returns:
        One row per example and patch (:mod:`attnprobe.patch.table`): ``effect`` 1 = the patch
        restores (denoising) or destroys (noising) the whole clean−corrupt difference.
        :func:`attnprobe.patch.summary` gives the mean per head.

    Example:
        >>> model, tok = ap.load_model("ref:induction")
        >>> clean = ["t05 t11 t40 t03 t17 t42 t08 t55 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> corrupt = ["t60 t61 t62 t63 t01 t02 t04 t06 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> copies = list(range(9, 16))  # second-copy positions ([BOS] is position 0)
        >>> table = ap.patch.heads(model, tok, clean, corrupt, "logit:next",
        ...                        metric_positions=copies)
        >>> ap.patch.summary(table).sort_values("effect", ascending=False).head(3)
        >>> each = ap.patch.heads(model, tok, clean, corrupt, "logit:next", scope="layer:1",
        ...                       positions="each", metric_positions=copies)
    """
    return run(model, tokenizer, clean, corrupt, metric, "heads", corpus=corpus, site=site,
               positions=positions, direction=direction, per=per, **keywords)


def path(model: nn.Module, tokenizer: Any, clean: Any, corrupt: Any, metric: MetricLike, *,
         receivers: ScopeLike, senders: ScopeLike = "all", into: str | Sequence[str] = "q",
         corpus: CorpusOptions | None = None, **keywords: Any) -> pd.DataFrame:
    """Path patching (Wang et al. 2022; Goldowsky-Dill et al. 2023;
    [causal methods](../guide/causal-methods.md#path-patching); module
    :mod:`attnprobe.patch.paths`): each sender head's output from the other run reaches only
    the receivers' ``into`` inputs; every other path is frozen at the base run. The other
    arguments (``direction``, ``positions``, ``per``, ``corpus`` and the keywords of
    :func:`run`) are those of :func:`heads`.

    Args:
        receivers: the receiver heads (a scope, e.g. ``"layer:1"`` or ``"heads:1.0,1.2"``).
        senders: the sender heads (a scope); only those in layers before a receiver count.
        into: ``"q"``, ``"k"``, ``"v"`` or several (``("q", "k", "v")``: patched together).
        **keywords: ``per``: ``"head"`` (each sender alone, the default), ``"layer"`` (each
            layer's senders together) or ``"scope"`` (every sender at once); ``positions``:
            ``"all"`` or ``"each"`` (the sender's output at one position); ``direction``;
            and the keywords of :func:`run`.

    Returns:
        The table of :func:`heads` (``layer``/``head``: the sender) plus ``sender_layer``,
        ``sender_head``, ``receivers`` and ``into``.

    Example (the previous-token heads reach the induction heads through their keys):
        >>> model, tok = ap.load_model("ref:induction")
        >>> clean = ["t05 t11 t40 t03 t17 t42 t08 t55 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> corrupt = ["t60 t61 t62 t63 t01 t02 t04 t06 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> copies = list(range(9, 16))  # second-copy positions ([BOS] is position 0)
        >>> for into in ("q", "k", "v"):
        ...     table = ap.patch.path(model, tok, clean, corrupt, "logit:next",
        ...                           senders="layer:0", receivers="layer:1", into=into,
        ...                           direction="noising", metric_positions=copies)
        ...     print(into, ap.patch.summary(table)["effect"].round(2).tolist())
    """
    return run(model, tokenizer, clean, corrupt, metric, "path", corpus=corpus,
               receivers=None if receivers is None else str(Scope.parse(receivers)),
               senders=str(Scope.parse(senders)), into=into, **keywords)


def attribution(model: nn.Module, tokenizer: Any, clean: Any, corrupt: Any,
                metric: MetricLike, *, site: str = "output", positions: str = "all",
                direction: str = "denoising", corpus: CorpusOptions | None = None,
                **keywords: Any) -> pd.DataFrame:
    """Attribution patching (Nanda 2023; Syed et al. 2023;
    [causal methods](../guide/causal-methods.md#attribution-patching); module
    :mod:`attnprobe.patch.attribution_patching`): ``patched − base ≈ (a_other − a_base) ·
    ∂m/∂a`` at the base run, for every scoped head (× position) from one forward per input
    and one backward, normalised like :func:`heads`. :func:`attnprobe.patch.agreement` sets
    it next to a real :func:`heads` table with their correlation. The arguments are those of
    :func:`heads` (no ``per``: one head at a time).

    Example:
        >>> model, tok = ap.load_model("ref:induction")
        >>> clean = ["t05 t11 t40 t03 t17 t42 t08 t55 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> corrupt = ["t60 t61 t62 t63 t01 t02 t04 t06 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> copies = list(range(9, 16))  # second-copy positions ([BOS] is position 0)
        >>> estimate = ap.patch.attribution(model, tok, clean, corrupt, "logit:next",
        ...                                 metric_positions=copies)
        >>> real = ap.patch.heads(model, tok, clean, corrupt, "logit:next",
        ...                       metric_positions=copies)
        >>> ap.patch.agreement(estimate, real)
    """
    return run(model, tokenizer, clean, corrupt, metric, "attribution", corpus=corpus,
               site=site, positions=positions, direction=direction, **keywords)
