"""What a comparison of attention with attributions computes beyond its methods, views and
the corpus options: one parameter object, so :func:`~attnprobe.attribution.compare` takes
the corpus signature plus ``options``.

Example:
    >>> ComparisonOptions(query="last", n_steps=16).top_k is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from attnprobe.core.corpus_options import AnalysisOptions

__all__ = ["COMPARISON_FIELDS", "ComparisonOptions"]


@dataclass(frozen=True)
class ComparisonOptions(AnalysisOptions):
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

    owner: ClassVar[str] = "compare()"

    query: str | int = "auto"
    top_k: int | None = None
    drop_special: bool = True
    n_steps: int = 50
    generate: int | None = None
    sample: bool = False


COMPARISON_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ComparisonOptions))
