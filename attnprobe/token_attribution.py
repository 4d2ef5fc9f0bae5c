"""One example's token importance for one target, by one method: :class:`TokenAttribution`
(re-exported by :mod:`attnprobe.types`), and its tidy column names."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from attnprobe.core.display import counted, describe, quoted
from attnprobe.core.tokens import guess_style, readable
from attnprobe.errors import InputError

__all__ = ["ATTRIBUTION_COLUMNS", "TokenAttribution"]

# Tidy column names of TokenAttribution.to_frame().
ATTRIBUTION_COLUMNS = ("example_id", "method", "target", "position", "token", "score")


@dataclass(frozen=True)
class TokenAttribution:
    """How much each input token matters for one example and one target, by one method.

    Args:
        scores: float tensor ``[token]``, one score per input token (signed, as the method
            gives it; attention views are non-negative).
        tokens: the input tokens, one per score.
        method: what produced the scores, e.g. ``integrated_gradients`` or ``rollout@L3``.
        target: what the scores explain, e.g. ``class:1`` or ``similarity:<text>``.
        example_id: free label carried into tables.
        delta: the method's convergence error when it has one (Integrated Gradients:
            ``|Σ attributions - (f(x) - f(baseline))|``; ``attn_lrp``: its signed
            conservation gap ``Σ relevance - f(x)``), else ``None``.
    """

    scores: torch.Tensor
    tokens: tuple[str, ...]
    method: str
    target: str
    example_id: str = ""
    delta: float | None = None

    def __post_init__(self) -> None:
        scores = torch.as_tensor(self.scores).detach().to("cpu", torch.float64).flatten()
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "tokens", tuple(str(t) for t in self.tokens))
        if len(scores) != len(self.tokens):
            raise InputError(f"{len(scores)} scores for {len(self.tokens)} tokens "
                             f"({self.method}, example {self.example_id!r})")
        if not torch.isfinite(scores).all():
            raise InputError(f"{self.method} gave NaN or inf scores for example "
                             f"{self.example_id!r}")

    def __repr__(self) -> str:
        top = int(self.scores.abs().argmax()) if len(self.scores) else None
        return describe(
            "TokenAttribution", f"{self.method} for {quoted(self.target, 40)}",
            counted(len(self.tokens), "token"),
            None if top is None else
            f"top {quoted(readable([self.tokens[top]], guess_style(self.tokens))[0], 20)} "
            f"{float(self.scores[top]):.3g}",
            None if self.delta is None else f"delta {self.delta:.3g}",
            f"example {self.example_id!r}" if self.example_id else None)

    def to_frame(self) -> pd.DataFrame:
        """One row per token; columns ``ATTRIBUTION_COLUMNS`` (tokens as people read them,
        :func:`attnprobe.core.tokens.readable`)."""
        n = len(self.tokens)
        return pd.DataFrame({"example_id": [self.example_id] * n, "method": [self.method] * n,
                             "target": [self.target] * n, "position": range(n),
                             "token": readable(self.tokens, None), "score": self.scores.numpy()},
                            columns=list(ATTRIBUTION_COLUMNS))
