"""What an attribution computes beyond the corpus options every analysis shares: one
parameter object, so :func:`~attnprobe.attribution.methods.attribute` takes the corpus
signature plus ``options``.

Example:
    >>> AttributionOptions(n_steps=16).with_keywords({"internal_batch_size": 4})
    AttributionOptions(n_steps=16, internal_batch_size=4, embedding=None)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from torch import nn

from attnprobe.core.corpus_options import AnalysisOptions

__all__ = ["ATTRIBUTION_FIELDS", "AttributionOptions"]


@dataclass(frozen=True)
class AttributionOptions(AnalysisOptions):
    """The attribution's own options (the corpus options — batch size, max length,
    truncation, seed, budget, progress — are its
    :class:`~attnprobe.core.corpus_options.CorpusOptions`).

    Attributes:
        n_steps: Integrated Gradients path points.
        internal_batch_size: path points per forward (None: up to
            :data:`~attnprobe.attribution.methods.PASS_TOKENS` tokens per forward).
        embedding: the input embedding layer (module or path) when the default pick is
            wrong.
    """

    owner: ClassVar[str] = "attribute()"

    n_steps: int = 50
    internal_batch_size: int | None = None
    embedding: nn.Module | str | None = None


ATTRIBUTION_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(AttributionOptions))
