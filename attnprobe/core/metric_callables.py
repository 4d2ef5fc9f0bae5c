"""What a callable metric receives, told by its signature.

attnprobe calls a metric with ``(output, batch)``: what the model returned and the batch's
``input_ids`` / ``attention_mask`` ``[batch, seq]``. TransformerLens users write
``lambda logits: ...``; a callable that takes exactly one positional argument is given the
logits ``[batch, seq, vocab]`` alone. Anything else is a one-line error saying what a
callable receives, before any forward.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from attnprobe.errors import InputError

__all__ = ["metric_function"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_RECEIVES = ("a callable metric receives (output, batch) — what the model returned and "
             "the batch's input_ids / attention_mask — or, with one argument, the logits "
             "[batch, seq, vocab]")


def _arity(fn: Callable[..., Any]) -> tuple[int, int, list[str]] | None:
    """``(required, most, keyword_only)``: the positional arguments ``fn`` needs and takes
    (``most`` -1: any number) and its required keyword-only ones; None when Python cannot
    tell (some builtins)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = signature.parameters.values()
    positional = [p for p in params if p.kind in _POSITIONAL]
    required = sum(p.default is inspect.Parameter.empty for p in positional)
    keyword_only = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY
                    and p.default is inspect.Parameter.empty]
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return required, -1, keyword_only
    return required, len(positional), keyword_only


def metric_function(fn: Callable[..., Any],
                    logits_of: Callable[[Any, str], torch.Tensor]
                    ) -> Callable[[Any, Any], torch.Tensor]:
    """``fn`` as a metric of ``(output, batch)`` (module docstring); ``logits_of(output,
    spec)`` reads the logits ``[batch, seq, vocab]`` for a callable of the logits alone.

    Raises:
        InputError: a callable that takes neither two positional arguments nor one.

    Example:
        >>> metric = metric_function(lambda logits: logits[:, -1, 5], lambda o, s: o)
        >>> logits = torch.zeros(2, 3, 8)
        >>> metric(logits, {"input_ids": torch.zeros(2, 3, dtype=torch.long)}).shape
        torch.Size([2])
    """
    arity = _arity(fn)
    if arity is None:
        return fn
    required, most, keyword_only = arity
    name = getattr(fn, "__name__", type(fn).__name__)
    if keyword_only:  # nothing attnprobe passes fills them
        raise InputError(f"metric callable {name} needs keyword argument(s) "
                         f"{', '.join(keyword_only)}; {_RECEIVES}")
    if required <= 2 and (most == -1 or most >= 2):
        return fn
    if required <= 1 and most == 1:
        def of_logits(output: Any, batch: Any) -> torch.Tensor:
            return fn(logits_of(output, "custom"))

        return of_logits
    raise InputError(f"metric callable {name} takes {required} required positional "
                     f"argument(s); {_RECEIVES}")
