"""Previous-token, duplicate-token and induction heads on repeated random tokens.

The probe (TransformerLens demos; Olsson et al. 2022, induction and duplicate-token scores):
random tokens ``x_1..x_m`` repeated, ``x_1..x_m x_1..x_m``, inside the tokenizer's own template
— what ``tokenizer(text)`` adds around a text (:func:`~attnprobe.core.tokens.special_template`):
``[CLS] … [SEP]`` for BERT, ``<s> …`` for LLaMA, nothing for GPT-2, ``[BOS] …`` for attnprobe's
word tokenizer. On such input the token-match statistics are exactly the published diagonals:
duplicate = A[i, i-m], induction = A[i, i-m+1], and for encoders the look-ahead analogues A[i,
i+m] and A[i, i+m+1] (special keys excluded and the row renormalised).

The tokens are drawn from the tokenizer's *ordinary* tokens: no special token, no unknown
token, no ``[unused]``-style placeholder, no punctuation and no blank token.

**Length.** Heads are probed inside the context the model was trained on: past it, position
codes the model never saw blur its positional heads (``ref:induction``, trained on 48 tokens,
gives ``rep_induction`` 0.77–0.85 at 65 tokens and 0.93–0.96 at 47). The default is what fits
that context (:func:`probe_limits`), at most :data:`DEFAULT_PROBE_LENGTH` tokens per copy; a
longer length the model's positions still hold is a warning naming the limit, one its
positions cannot hold an error.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnprobe.capture.context import capture
from attnprobe.capture.parts import Reduce
from attnprobe.core.reducers import Tally
from attnprobe.core.scope import ScopeLike
from attnprobe.core.tokens import special_template, token_classes, vocabulary_ids
from attnprobe.errors import InputError
from attnprobe.heads.census_stats import CensusStats
from attnprobe.inputs.text import max_length_of, model_inputs

__all__ = ["DEFAULT_PROBE_LENGTH", "ProbeLimits", "limits_within", "probe_length",
           "probe_limits", "probe_tally", "probe_vocabulary", "repeated_token_scores",
           "repeated_tokens", "trained_length"]

DEFAULT_PROBE_LENGTH = 32  # tokens per copy; the input is 2 x this plus the template
N_SEQUENCES = 4


def probe_vocabulary(tokenizer: Any, classes: dict[str, torch.Tensor] | None = None
                     ) -> torch.Tensor:
    """Ids the probe may draw (module docstring), sorted."""
    classes = classes if classes is not None else token_classes(tokenizer)
    excluded = [classes["special"], classes.get("punct", torch.empty(0, dtype=torch.long))]
    unk = getattr(tokenizer, "unk_token_id", None)
    if isinstance(unk, int):
        excluded.append(torch.tensor([unk]))
    plain = vocabulary_ids(tokenizer).plain
    return plain[~torch.isin(plain, torch.cat(excluded))]


def _check_length(length: object) -> int:
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise InputError(f"probe length must be an integer of at least 2 (tokens per copy); "
                         f"got {length!r}")
    return length


def trained_length(model: nn.Module) -> int | None:
    """The length of the sequences ``model`` was trained on, when it says so
    (``model.trained_length`` or ``model.config.trained_length``, as attnprobe's trained
    reference models do), else None. A HuggingFace checkpoint's trained context is its position
    limit (``max_position_embeddings``), which :func:`probe_limits` reads anyway."""
    for owner in (model, getattr(model, "config", None)):
        value = getattr(owner, "trained_length", None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass(frozen=True)
class ProbeLimits:
    """Tokens (template included) the probe may take: ``positions``, what the model accepts
    (the tokenizer's ``model_max_length`` and the position table); ``trained``, what it was
    trained on (at most ``positions``). None where unknown."""

    positions: int | None = None
    trained: int | None = None


def probe_limits(model: nn.Module, tokenizer: Any) -> ProbeLimits:
    """The model's :class:`ProbeLimits`."""
    return limits_within(model, max_length_of(model, tokenizer))


def limits_within(model: nn.Module, positions: int | None) -> ProbeLimits:
    """The model's :class:`ProbeLimits` when its ``positions`` (:func:`max_length_of`) are
    already known."""
    trained = trained_length(model)
    if trained is None or (positions is not None and trained > positions):
        trained = positions
    return ProbeLimits(positions, trained)


def probe_length(tokenizer: Any, length: int | None = None, *, max_length: int | None = None,
                 trained_length: int | None = None,
                 classes: dict[str, torch.Tensor] | None = None,
                 vocabulary: torch.Tensor | None = None) -> int:
    """Tokens per copy of the probe: ``length``, checked, or by default what fits the
    model's trained context — ``(trained_length - template) // 2`` (``max_length`` when no
    trained length is known), at most :data:`DEFAULT_PROBE_LENGTH` and the tokenizer's
    ordinary tokens.

    ``max_length``: the most tokens the model accepts (template included); ``trained_length``:
    the length it was trained on (:func:`probe_limits` gives both); ``vocabulary``: the
    :func:`probe_vocabulary`, when already known. A given length beyond
    ``trained_length`` that ``max_length`` still holds is a warning naming the limit.

    Raises InputError when a given length does not fit the positions or the vocabulary, or
    when not even 2 tokens fit.
    """
    prefix, suffix = special_template(tokenizer)
    n_special = len(prefix) + len(suffix)
    room = None if max_length is None else (max_length - n_special) // 2
    trained = trained_length if trained_length is not None else max_length
    if trained is not None and max_length is not None:
        trained = min(trained, max_length)
    fits = None if trained is None else (trained - n_special) // 2  # the trained context
    n_vocab = len(probe_vocabulary(tokenizer, classes) if vocabulary is None else vocabulary)
    if length is None:
        length = min(DEFAULT_PROBE_LENGTH, n_vocab, fits if fits is not None else n_vocab)
        if length < 2:
            what = (f"the tokenizer has {n_vocab} ordinary token(s)" if n_vocab < 2 else
                    f"the model takes {trained} tokens" if trained == max_length else
                    f"the model was trained on {trained} tokens")
            raise InputError(f"the repeated-token probe needs 2 x 2 tokens + {n_special} "
                             f"special, but {what}; pass repeated=False (CLI --no-repeated)")
        return length
    length = _check_length(length)
    if room is not None and length > room:
        raise InputError(f"probe length {length} needs 2 x {length} + {n_special} = "
                         f"{2 * length + n_special} tokens but the model takes at most "
                         f"{max_length}; use a probe length of at most "
                         f"{max(min(room, n_vocab), 0)}")
    if length > n_vocab:
        raise InputError(f"probe length {length} exceeds the tokenizer's {n_vocab} ordinary "
                         f"tokens (each copy draws distinct tokens); use at most {n_vocab}")
    if fits is not None and length > fits:
        warnings.warn(f"probe length {length} builds {2 * length + n_special} tokens, more "
                      f"than the {trained} the model was trained on: its heads may not "
                      f"behave as trained there; a length of at most {max(fits, 0)} fits",
                      UserWarning, stacklevel=3)
    return length


def repeated_tokens(tokenizer: Any, *, length: int | None = None,
                    n_sequences: int = N_SEQUENCES, seed: int = 0,
                    max_length: int | None = None,
                    classes: dict[str, torch.Tensor] | None = None,
                    vocabulary: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """``input_ids`` / ``attention_mask`` ``[n_sequences, prefix + 2 * length + suffix]``.

    Tokens are drawn without replacement within a sequence, so every token of the second
    copy occurs exactly once before it; the template is the tokenizer's
    (:func:`~attnprobe.core.tokens.special_template`). ``length`` as in :func:`probe_length`;
    ``vocabulary``: the :func:`probe_vocabulary`, when already known.
    """
    if isinstance(n_sequences, bool) or not isinstance(n_sequences, int) or n_sequences < 1:
        raise InputError(f"n_sequences must be a positive integer; got {n_sequences!r}")
    vocab = probe_vocabulary(tokenizer, classes) if vocabulary is None else vocabulary
    length = probe_length(tokenizer, length, max_length=max_length, classes=classes,
                          vocabulary=vocab)
    prefix, suffix = special_template(tokenizer)
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n_sequences):
        draw = vocab[torch.randperm(len(vocab), generator=generator)[:length]].tolist()
        rows.append([*prefix, *draw, *draw, *suffix])
    ids = torch.tensor(rows)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def repeated_token_scores(model: nn.Module, tokenizer: Any, *, length: int | None = None,
                          n_sequences: int = N_SEQUENCES, seed: int = 0,
                          classes: dict[str, torch.Tensor] | None = None,
                          scope: ScopeLike = "all") -> Tally:
    """``rep_prev``, ``rep_duplicate``, ``rep_induction``, ``rep_duplicate_ahead`` and
    ``rep_induction_ahead`` per head, as a mergeable tally (see
    :class:`~attnprobe.heads.census_stats.CensusStats`). ``length``: tokens per copy
    (:func:`probe_length`, within the model's :func:`probe_limits`); ``classes``: the
    tokenizer's token classes when already known (:func:`token_classes`).

    Example:
        >>> scores = repeated_token_scores(lm, lm_tok, n_sequences=4).summary()  # [BOS] x x
        >>> len(scores)                                 # one row per head
        8
        >>> list(scores.columns[5:])
        ['rep_prev', 'rep_duplicate', 'rep_induction', 'rep_duplicate_ahead', 'rep_induction_ahead']
        >>> bool(scores["rep_induction_ahead"].eq(0).all())   # causal: no later copy is seen
        True
        >>> scores.nlargest(4, "rep_induction")[["head_id", "rep_induction"]]
    """
    classes = classes if classes is not None else token_classes(tokenizer)
    limits = probe_limits(model, tokenizer)
    vocabulary = probe_vocabulary(tokenizer, classes)
    length = probe_length(tokenizer, length, max_length=limits.positions,
                          trained_length=limits.trained, classes=classes, vocabulary=vocabulary)
    batch = repeated_tokens(tokenizer, length=length, n_sequences=n_sequences, seed=seed,
                            max_length=limits.positions, classes=classes,
                            vocabulary=vocabulary)
    return probe_tally(model, batch, classes=classes, scope=scope)


def probe_tally(model: nn.Module, batch: dict[str, torch.Tensor], *,
                classes: dict[str, torch.Tensor], scope: ScopeLike = "all") -> Tally:
    """The ``rep_*`` tally of a probe batch from :func:`repeated_tokens` (one forward)."""
    stats = CensusStats(classes=classes, groups=frozenset({"match"}), prefix="rep_")
    with torch.no_grad(), capture(model, scope, parts=[Reduce([stats])],
                                  stop_early=True) as cap:
        model(**model_inputs(model, batch))
    return cap.tally
