"""What a census computes beyond the corpus options every analysis shares: one parameter
object, so :func:`~attnprobe.heads.census` takes the corpus signature plus ``options``.

Example:
    >>> options = CensusOptions(similarity=False, repeated=False)  # streaming scores only
    >>> options.max_offset
    64
    >>> census(model, tok, texts, options=options).scores()  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from attnprobe.core.corpus_options import AnalysisOptions
from attnprobe.errors import InputError
from attnprobe.heads.dependencies import MIN_COUNT
from attnprobe.heads.scores import DEFAULT_MAX_OFFSET

__all__ = ["CensusOptions"]


def _positive_or_none(name: str, value: object, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise InputError(f"{name} must be a positive integer or None ({what}); got {value!r}")


@dataclass(frozen=True)
class CensusOptions(AnalysisOptions):
    """The census's own options (the corpus options — scope, batch size, max length,
    truncation, seed, progress, distributed — are its
    :class:`~attnprobe.core.corpus_options.CorpusOptions`).

    Attributes:
        syntax: parse ``texts`` with spaCy (``nlp`` or the packaged English pipeline) to
            score heads against dependency relations; default: only when trees are given.
        similarity: accumulate Jensen–Shannon distances between heads, from sampled rows
            (only those rows are kept, so long inputs still stream).
        similarity_rows: query rows per batch used for the distances, evenly spaced over
            the batch's real rows (their cost is heads² × rows × keys); ``None``: every row.
        repeated: also run the repeated-random-token probe (``rep_*`` scores), built
            through the tokenizer's own template (``[CLS] x x [SEP]``, ``<s> x x`` ...).
        probe_length: tokens per copy of the probe. Default: what fits the context the
            model was trained on, ``(limit - template) // 2``, at most 32 and the tokenizer's
            ordinary tokens; the limit is ``model.trained_length`` where the model gives it
            (``ref:induction``: 48, so 23), else its positions (``max_position_embeddings``,
            the tokenizer's ``model_max_length``). A longer length is a warning naming the
            limit; one the model's positions cannot hold is an error.
        window: offsets ±window get their own score column.
        min_count: words a dependency relation needs (syntax labels and table).
        from_agg: how a word's attention is pooled from its pieces' rows
            (:func:`~attnprobe.heads.words.to_words`).
        nlp: the spaCy pipeline that parses texts for ``syntax``.
        max_offset: relative offsets beyond ±max_offset (default 64) share one ``far`` bin
            in ``.offsets()`` and the argmax (``pos_*``) statistics; sentences of up to 65
            tokens keep every offset. ``None`` keeps a bin per offset (on long inputs every
            block of rows then costs O(length) statistics).
    """

    owner: ClassVar[str] = "census()"

    syntax: bool | None = None
    similarity: bool = True
    similarity_rows: int | None = 16
    repeated: bool = True
    probe_length: int | None = None
    window: int = 3
    min_count: int = MIN_COUNT
    from_agg: str = "mean"
    nlp: Any = None
    max_offset: int | None = DEFAULT_MAX_OFFSET

    def __post_init__(self) -> None:
        _positive_or_none("similarity_rows", self.similarity_rows, "every row")
        _positive_or_none("max_offset", self.max_offset, "every offset")
        if self.probe_length is not None and not self.repeated:
            raise InputError("probe_length needs the repeated-token probe; drop "
                             "repeated=False")
