"""Previous-token, duplicate-token and induction heads on repeated random tokens.

The probe (TransformerLens demos, Olsson et al.; methods §11.3 and §11.5): random tokens
``x_1..x_m`` repeated, ``x_1..x_m x_1..x_m``, wrapped in the tokenizer's special tokens
(``[CLS] ... [SEP]`` for BERT, nothing for GPT-2). On such input the token-match statistics
are exactly the published diagonals: duplicate = A[i, i-m], induction = A[i, i-m+1], and for
encoders the look-ahead analogues A[i, i+m] and A[i, i+m+1] (special keys excluded and the
row renormalised).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attnprobe.capture.context import capture
from attnprobe.capture.text import max_length_of, model_inputs
from attnprobe.core.reducers import Tally
from attnprobe.core.scope import ScopeLike
from attnprobe.core.tokens import looks_special, token_classes
from attnprobe.errors import InputError
from attnprobe.heads.census_stats import CensusStats


def probe_vocabulary(tokenizer: Any, special_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Ids the probe may draw: no special tokens and no ``[unused]``-style placeholders."""
    if special_ids is None:
        special_ids = token_classes(tokenizer)["special"]
    special = set(special_ids.tolist())
    vocab = tokenizer.get_vocab()
    ids = sorted(i for tok, i in vocab.items()
                 if i not in special and not looks_special(tok) and tok.strip())
    if len(ids) < 2:
        raise InputError("the tokenizer has too few ordinary tokens for a repeated-token probe")
    return torch.tensor(ids)


def _wrap(tokenizer: Any, ids: list[int]) -> list[int]:
    wrap = getattr(tokenizer, "build_inputs_with_special_tokens", None)
    return wrap(ids) if wrap else ids


def repeated_tokens(tokenizer: Any, *, length: int = 32, n_sequences: int = 4,
                    seed: int = 0, max_length: int | None = None,
                    special_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """``input_ids`` / ``attention_mask`` ``[n_sequences, 2 * length + specials]``.

    Tokens are drawn without replacement within a sequence, so every token of the second
    copy occurs exactly once before it. ``max_length`` (the model's limit) shortens ``length``
    so that the wrapped sequence fits.
    """
    if max_length is not None:
        length = min(length, (max_length - len(_wrap(tokenizer, []))) // 2)
    if length < 2 or n_sequences < 1:
        raise InputError(f"the repeated-token probe needs length >= 2 (the model allows "
                         f"{max_length} tokens) and n_sequences >= 1")
    vocab = probe_vocabulary(tokenizer, special_ids)
    if len(vocab) < length:
        raise InputError(f"length {length} exceeds the {len(vocab)} ordinary tokens")
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n_sequences):
        draw = vocab[torch.randperm(len(vocab), generator=generator)[:length]].tolist()
        rows.append(_wrap(tokenizer, draw + draw))
    ids = torch.tensor(rows)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def repeated_token_scores(model: nn.Module, tokenizer: Any, *, length: int = 32,
                          n_sequences: int = 4, seed: int = 0,
                          classes: dict[str, torch.Tensor] | None = None,
                          scope: ScopeLike = "all") -> Tally:
    """``rep_prev``, ``rep_duplicate``, ``rep_induction``, ``rep_duplicate_ahead`` and
    ``rep_induction_ahead`` per head, as a mergeable tally (see
    :class:`~attnprobe.heads.census_stats.CensusStats`). ``classes``: the tokenizer's token
    classes when already known (:func:`token_classes`)."""
    classes = classes if classes is not None else token_classes(tokenizer)
    batch = repeated_tokens(tokenizer, length=length, n_sequences=n_sequences, seed=seed,
                            max_length=max_length_of(model, tokenizer),
                            special_ids=classes["special"])
    stats = CensusStats(classes=classes, parts=frozenset({"match"}), prefix="rep_")
    with torch.no_grad(), capture(model, scope, keep=False, reducers=[stats],
                                  stop_early=True) as cap:
        model(**model_inputs(model, batch))
    return cap.tally
