"""What a comparison of attention with attributions computes beyond its methods, views and
the corpus options: one parameter object, so :func:`~attnprobe.attribution.compare` takes
the corpus signature plus ``options``.

Example:
    >>> ComparisonOptions(query="last", n_steps=16).top_k is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from attnprobe.errors import InputError

__all__ = ["COMPARISON_FIELDS", "ComparisonOptions"]


@dataclass(frozen=True)
class ComparisonOptions:
    """The comparison's own options (the corpus options — scope, batch size, max length,
    truncation, seed, progress, distributed — are its
    :class:`~attnprobe.core.corpus_options.CorpusOptions`).

    Attributes:
        query: which row the views read: ``"auto"`` (the last real token of a causal
            model, the first token of any other), ``"cls"``, ``"last"``, ``"mean"``,
            ``"max"``, or an int row (:mod:`attnprobe.attribution.views`).
        top_k: top-k size for the overlap metric (default 20 % of the compared tokens; at
            most the number of compared tokens).
        drop_special: leave special tokens ([CLS], [SEP], BOS ...) out of every metric
            (``[UNK]`` stays in: it stands for a word of the text).
        n_steps: Integrated Gradients path points.
        generate: continue each text by this many tokens (a causal language model; target
            ``"next-token"``) and explain every generated token.
        sample: with ``generate``, sample the tokens (seeded by ``seed``) instead of taking
            the most likely one.
    """

    query: str | int = "auto"
    top_k: int | None = None
    drop_special: bool = True
    n_steps: int = 50
    generate: int | None = None
    sample: bool = False

    def with_keywords(self, keywords: Mapping[str, Any]) -> ComparisonOptions:
        """These options with ``keywords`` (option names) replaced; an unknown name is an
        InputError naming the options."""
        unknown = sorted(set(keywords) - set(COMPARISON_FIELDS))
        if unknown:
            raise InputError(f"compare() got unknown option(s) {', '.join(unknown)}; the "
                             f"options are {', '.join(COMPARISON_FIELDS)}")
        return replace(self, **keywords) if keywords else self


COMPARISON_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ComparisonOptions))
