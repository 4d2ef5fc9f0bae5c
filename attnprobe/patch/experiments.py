"""Patching experiments as tidy tables: ``run(model, tokenizer, clean, corrupt, metric,
experiment)`` and one function per experiment (:func:`heads`, :func:`path`,
:func:`attribution`).

===============  ==========================================================================
experiment       what it does; its options (default)
===============  ==========================================================================
``heads``        activation patching (:mod:`attnprobe.patch.activation`): each scoped head's
                 ``site`` (``output``) taken from the other run, at every position or each
                 (``positions``: ``all``), ``per`` head (or layer, or the whole scope)
``path``         path patching (:mod:`attnprobe.patch.paths`): each sender's output reaches
                 only the ``receivers``' ``into`` inputs (``q``); ``senders`` (``all``),
                 ``positions``, ``per`` (``head`` or ``scope``)
``attribution``  attribution patching (:mod:`attnprobe.patch.attribution_patching`): the first-order
                 estimate of ``heads`` from two forwards and one backward; ``site``,
                 ``positions``
===============  ==========================================================================

Every experiment takes ``direction`` (``denoising``: the corrupted run patched with clean
activations, what is *sufficient*; ``noising``: the clean run patched with corrupted ones,
what is *necessary*) and the shared keywords of :func:`run`. Tables:
:mod:`attnprobe.patch.table`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
from torch import nn

from attnprobe.capture.info import model_scope
from attnprobe.capture.text import DEFAULT_BATCH_SIZE, Truncation
from attnprobe.core.checks import check_eval, check_number
from attnprobe.core.distributed import rank_and_world
from attnprobe.core.metric import Metric, MetricFn, Positions
from attnprobe.core.positions import fit_positions
from attnprobe.core.registry import one_of
from attnprobe.core.scope import Scope, ScopeLike
from attnprobe.errors import InputError
from attnprobe.patch import activation, attribution_patching, paths, stream_patching  # noqa: F401
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
    if experiment not in EXPERIMENTS:
        raise InputError(one_of("patching experiment", experiment, EXPERIMENTS.names()))
    return EXPERIMENTS.get(experiment).params


def _check_model(model: Any) -> None:
    if not isinstance(model, nn.Module):
        raise InputError(f"model must be a torch module; got {type(model).__name__}")
    check_eval(model)


def _sites(experiment: str, params: Params) -> list[str]:
    """The head sites the experiment reads or rewrites (residual, mlp: none, they hook the
    model's blocks: :mod:`attnprobe.patch.stream`)."""
    if experiment == "path":
        return ["output", *params.into]  # type: ignore[attr-defined]
    site = getattr(params, "site", None)
    return [] if site is None else [site]


def run(model: nn.Module, tokenizer: Any, clean: Any, corrupt: Any, metric: MetricLike,
        experiment: str = "heads", *, scope: ScopeLike = "all",
        batch_size: int = DEFAULT_BATCH_SIZE, truncation: Truncation = "error", seed: int = 0,
        progress: bool = False, distributed: bool | None = None,
        max_length: int | None = None, metric_positions: Positions = "last",
        pairs: Sequence[Pair] | None = None, **options: Any) -> pd.DataFrame:
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
        scope: the heads patched (``heads``, ``attribution``; ``path`` takes ``senders``).
        batch_size: rows per forward (examples × patches; examples for ``attribution``).
        truncation / max_length: texts longer than the model allows (``"error"``, ``"cut"``
            both inputs of a pair alike, ``"skip"`` the pair).
        seed: part of the shared signature; patching draws nothing at random.
        progress: a progress bar over the forwards.
        distributed: split the work over the ranks of an initialised ``torch.distributed``
            group; every rank returns the single-process table.
        metric_positions: where a spec metric reads (``"last"``, ``"all"``, a position, a
            list, one list per example, or a bool mask ``[example, seq]`` as wide as the
            longest input; ``None``: the metric's default; :mod:`attnprobe.core.positions`).
        pairs: for ``metric="logit_diff"``, one ``(correct, wrong)`` pair per example.
        **options: the experiment's options (:func:`params_of`).

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
    spec = EXPERIMENTS.get(experiment) if experiment in EXPERIMENTS else None
    if spec is None:
        raise InputError(one_of("patching experiment", experiment, EXPERIMENTS.names()))
    params = spec.params.build(spec.name, options, SHARED)
    check_number("batch_size", batch_size, integer=True, minimum=1)
    check_number("seed", seed, integer=True, minimum=0)
    _check_model(model)
    direction = check_direction(params.direction)  # type: ignore[attr-defined]
    rank_and_world(distributed)  # distributed=True without a process group fails here
    if spec.name == "path" and not Scope.parse(scope).is_all:
        raise InputError("path patching takes senders= and receivers= instead of scope=")
    check_served(model, _sites(spec.name, params), f"patch {spec.name}")
    found = prepare_pairs(model, tokenizer, clean, corrupt, truncation=truncation,
                          max_length=max_length)
    metric_positions = fit_positions(metric_positions, found.input_lengths, "metric_positions")
    plan = MetricPlan(metric, tokenizer, metric_positions, pairs, found.n_inputs)
    job = Job(spec.name, model, tokenizer, found, plan, model_scope(model, scope), direction,
              params, batch_size, progress, distributed)
    table = spec.fn(job)
    table.attrs["metric_ids"] = plan.token_ids
    return table


def heads(model: nn.Module, tokenizer: Any, clean: Any, corrupt: Any, metric: MetricLike, *,
          site: str = "output", scope: ScopeLike = "all", positions: str = "all",
          direction: str = "denoising", per: str = "head",
          batch_size: int = DEFAULT_BATCH_SIZE, truncation: Truncation = "error",
          seed: int = 0, progress: bool = False, distributed: bool | None = None,
          max_length: int | None = None, metric_positions: Positions = "last",
          pairs: Sequence[Pair] | None = None) -> pd.DataFrame:
    """Activation patching of every scoped head
    ([causal methods](../guide/causal-methods.md#activation-patching); module
    :mod:`attnprobe.patch.activation`): the base run (corrupted when denoising, clean when
    noising) with one head's ``site`` taken from the other run — batched, one patch per batch
    row. The shared arguments (``scope``, ``batch_size``, ``metric_positions``, ``pairs``
    ...) are those of :func:`run`.

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
    return run(model, tokenizer, clean, corrupt, metric, "heads", scope=scope,
               batch_size=batch_size, truncation=truncation, seed=seed, progress=progress,
               distributed=distributed, max_length=max_length,
               metric_positions=metric_positions, pairs=pairs, site=site,
               positions=positions, direction=direction, per=per)


def path(model: nn.Module, tokenizer: Any, clean: Any, corrupt: Any, metric: MetricLike, *,
         receivers: ScopeLike, senders: ScopeLike = "all", into: str | Sequence[str] = "q",
         direction: str = "denoising", positions: str = "all", per: str = "head",
         batch_size: int = DEFAULT_BATCH_SIZE, truncation: Truncation = "error",
         seed: int = 0, progress: bool = False, distributed: bool | None = None,
         max_length: int | None = None, metric_positions: Positions = "last",
         pairs: Sequence[Pair] | None = None) -> pd.DataFrame:
    """Path patching (Wang et al. 2022; Goldowsky-Dill et al. 2023;
    [causal methods](../guide/causal-methods.md#path-patching); module
    :mod:`attnprobe.patch.paths`): each sender head's output from the other run reaches only
    the receivers' ``into`` inputs; every other path is frozen at the base run. The other
    arguments are those of :func:`heads` and :func:`run`.

    Args:
        receivers: the receiver heads (a scope, e.g. ``"layer:1"`` or ``"heads:1.0,1.2"``).
        senders: the sender heads (a scope); only those in layers before a receiver count.
        into: ``"q"``, ``"k"``, ``"v"`` or several (``("q", "k", "v")``: patched together).
        per: ``"head"`` (each sender alone), ``"layer"`` (each layer's senders together) or
            ``"scope"`` (every sender at once).
        positions: ``"all"`` or ``"each"`` (the sender's output at one position).

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
    return run(model, tokenizer, clean, corrupt, metric, "path", batch_size=batch_size,
               truncation=truncation, seed=seed, progress=progress, distributed=distributed,
               max_length=max_length, metric_positions=metric_positions, pairs=pairs,
               receivers=None if receivers is None else str(Scope.parse(receivers)),
               senders=str(Scope.parse(senders)), into=into, direction=direction,
               positions=positions, per=per)


def attribution(model: nn.Module, tokenizer: Any, clean: Any, corrupt: Any,
                metric: MetricLike, *, site: str = "output", scope: ScopeLike = "all",
                positions: str = "all", direction: str = "denoising",
                batch_size: int = DEFAULT_BATCH_SIZE, truncation: Truncation = "error",
                seed: int = 0, progress: bool = False, distributed: bool | None = None,
                max_length: int | None = None, metric_positions: Positions = "last",
                pairs: Sequence[Pair] | None = None) -> pd.DataFrame:
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
    return run(model, tokenizer, clean, corrupt, metric, "attribution", scope=scope,
               batch_size=batch_size, truncation=truncation, seed=seed, progress=progress,
               distributed=distributed, max_length=max_length,
               metric_positions=metric_positions, pairs=pairs, site=site,
               positions=positions, direction=direction)
