"""One metric vocabulary for every causal experiment: what a run is scored by.

A :class:`Metric` reads one number per example off a forward's output (``[batch]``): the
quantity activation patching normalises, attention knockout and perturbations change, and
direct logit attribution decomposes. :func:`parse_metric` builds one from a spec
``kind:argument`` (``logit_diff:Paris,Rome``). The kinds are the entries of
:data:`~attnprobe.core.metric_kind.METRIC_KINDS`, one module each in
:mod:`attnprobe.core.metric_kinds`; their table is the README's "What is measured" (written
from the registry by ``make readme``). A callable ``(output, batch) -> Tensor[batch]`` is
recorded as ``custom``; a callable of one argument (TransformerLens' ``lambda logits: ...``)
gets the logits ``[batch, seq, vocab]``.

**Tokens** (:mod:`attnprobe.core.metric_tokens`): the text after the colon is split on
commas, each name stripped, and read as the model reads it mid-sentence: on byte-level BPE
(GPT-2, Qwen2) ``logit_diff: Paris, Rome`` reads ``ĠParis`` and ``ĠRome``, on SentencePiece
(LLaMA) ``▁Paris`` and ``▁Rome``, on WordPiece ``paris`` and ``rome``. A name that is several
tokens is an error naming its pieces; an exact vocabulary string (``Ġc``) or an id (``464``)
names its token. The spec the tables record shows the resolved vocabulary strings
(``logit_diff:ĠParis,ĠRome``) and :attr:`Metric.tokens` their ids. From Python,
``logit_diff`` also takes one ``(A, B)`` pair per example (:func:`parse_metric`'s ``pairs``).

**Positions** (``positions=``): ``"last"`` (the default: each example's last real token, the
next-token prediction), ``"all"`` (every real position; for ``:next`` metrics and ``loss``
every position whose next token is real), one list of positions for every example, one list
per example, or a ``[batch, seq]`` bool mask; :func:`default_positions` is ``all`` for the
metrics that read the input's next token, ``last`` for the others.

**Across runs** (patching): a metric that reads the input's own next token (``:next``,
``loss``) is fixed on the reference run (:meth:`Metric.fixed`), so every run reads the
reference input's next tokens — the clean answer, not each run's own (``logit:next(clean)``
in a patching table, :meth:`Metric.named_for`).

Metrics that are linear in the logits (``next-token``, ``logit``, ``logit_diff``) expose
:meth:`Metric.logit_terms`: the logits they sum, with their coefficients, so that a direct
logit attribution can decompose them exactly. A new kind is one module of
:mod:`attnprobe.core.metric_kinds`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnprobe.core.metric_base import Metric, MetricFn
from attnprobe.core.metric_callables import metric_function
from attnprobe.core.metric_kind import METRIC_KINDS, kind_of, metric_kinds
from attnprobe.core.metric_reading import LogitTerms, logits_of
from attnprobe.core.metric_tokens import token_id
from attnprobe.core.positions import Positions, positions_mask
from attnprobe.core.registry import one_of
from attnprobe.errors import InputError

__all__ = ["METRIC_KINDS", "LogitTerms", "Metric", "MetricFn", "Positions", "default_positions",
           "parse_metric", "positions_mask", "reads_next_token", "token_id"]


def parse_metric(spec: str | Metric | MetricFn, tokenizer: Any = None, *,
                 positions: Positions = "last",
                 pairs: Sequence[tuple[str | int, str | int]] | None = None) -> Metric:
    """The :class:`Metric` a spec names (module docstring).

    Args:
        spec: a spec string, a :class:`Metric` (returned as it is) or a callable
            ``(output, batch) -> Tensor[batch]`` or ``(logits) -> Tensor[batch]`` (spec
            ``custom``; :func:`~attnprobe.core.metric_callables.metric_function`).
        tokenizer: turns token names into ids (module docstring: a name is read as the
            model reads it mid-sentence).
        positions: where the metric reads (module docstring); default the last real token.
        pairs: for ``logit_diff``, one ``(correct, wrong)`` pair per example instead of the
            spec's one pair (``spec="logit_diff"``).

    Raises:
        InputError: an unknown kind, a name that is not one token (its pieces named), a
            bad position, a callable that takes neither ``(output, batch)`` nor ``(logits)``.

    Example:
        >>> ids = lm_tok([prompt], return_tensors="pt")
        >>> logits = lm(**ids)                          # [batch, seq, vocab]
        >>> diff = parse_metric("logit_diff:t05,t11", lm_tok)
        >>> a, b = lm_tok.get_vocab()["t05"], lm_tok.get_vocab()["t11"]
        >>> torch.allclose(diff(logits, ids), logits[:, -1, a] - logits[:, -1, b])
        True
        >>> loss = parse_metric("loss", positions="all")(logits, ids)   # [batch]
        >>> nll = torch.nn.functional.cross_entropy(logits[0, :-1], ids["input_ids"][0, 1:])
        >>> torch.allclose(loss, nll)
        True
    """
    if isinstance(spec, Metric):
        return spec
    if callable(spec) and not isinstance(spec, str):
        return Metric("custom", metric_function(spec, logits_of))
    if not isinstance(spec, str):
        raise InputError(f"metric must be a spec such as 'logit_diff:Paris,Rome', a Metric or a "
                         f"callable (output, batch) -> Tensor[batch]; got {type(spec).__name__}")
    kind, argument = kind_of(spec)
    if kind is None:
        name = spec.strip().partition(":")[0].strip().lower()
        metric_kinds()  # every kind registered, then named as before: alphabetically
        raise InputError(one_of("metric kind", name, METRIC_KINDS.names())
                         + " (e.g. 'logit_diff:Paris,Rome'), or pass a callable "
                         "(output, batch) -> Tensor[batch]")
    if pairs is not None:
        if kind.pairs is None:
            raise InputError(f"metric {kind.name} takes no pairs=; pairs are for "
                             + ", ".join(k.name for k in metric_kinds() if k.pairs))
        if argument.strip():
            raise InputError(f"give the {kind.name} tokens in the spec or as pairs=, not both")
        return kind.pairs(pairs, tokenizer, positions)
    return kind.build(argument, tokenizer, positions, None)


def default_positions(spec: Any) -> Positions:
    """Where a metric reads unless told: ``all`` for a spec that reads the input's own next
    token (``logit:next``, ``prob:next``, ``logprob:next``, ``loss``; the last position has
    none), ``last`` for every other spec and for a Metric or a callable.

    Example:
        >>> default_positions("logit:next"), default_positions("logit_diff:t05,t11")
        ('all', 'last')
    """
    return "all" if reads_next_token(spec) else "last"


def reads_next_token(spec: Any) -> bool:
    """Whether a spec reads the input's own next token (``:next`` kinds, ``loss``): a text
    of one token gives it nothing to read.

    Example:
        >>> reads_next_token("loss"), reads_next_token("logit:t05")
        (True, False)
    """
    if not isinstance(spec, str):
        return False
    kind, argument = kind_of(spec)
    return kind is not None and kind.reads_next(argument)
