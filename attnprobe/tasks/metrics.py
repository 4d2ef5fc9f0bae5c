"""Scores for synthetic tasks: alignment against the truth, sequence accuracy, BLEU."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import torch

from attnprobe.errors import InputError


def _check(attention: torch.Tensor, truth: torch.Tensor) -> None:
    if attention.ndim != 2 or truth.ndim != 1 or attention.shape[0] != truth.shape[0]:
        raise InputError(f"attention must be [target, source] and truth [target]; got "
                         f"{tuple(attention.shape)} and {tuple(truth.shape)}")


def alignment_accuracy(attention: torch.Tensor, truth: torch.Tensor) -> float:
    """``mean_t 1[argmax_j α_tj = π(t)]`` for ``attention [target, source]``, ``truth [target]``.

    Example:
        >>> attention = torch.tensor([[0.7, 0.2, 0.1],    # [target, source]
        ...                           [0.1, 0.3, 0.6],
        ...                           [0.2, 0.5, 0.3]])
        >>> round(alignment_accuracy(attention, torch.tensor([0, 1, 1])), 4)  # argmax 0, 2, 1
        0.6667
    """
    _check(attention, truth)
    return float((attention.argmax(-1) == truth).float().mean())


def gold_mass(attention: torch.Tensor, truth: torch.Tensor) -> float:
    """Mean attention weight on the true source position, ``mean_t α_{t, π(t)}``.

    Example:
        >>> attention = torch.tensor([[0.7, 0.2, 0.1],    # [target, source]
        ...                           [0.1, 0.3, 0.6],
        ...                           [0.2, 0.5, 0.3]])
        >>> round(gold_mass(attention, torch.tensor([0, 1, 1])), 4)   # (0.7 + 0.3 + 0.5) / 3
        0.5
    """
    _check(attention, truth)
    return float(attention.gather(-1, truth[:, None]).mean())


def alignment_error_rate(predicted: set[tuple[int, int]], sure: set[tuple[int, int]],
                         possible: set[tuple[int, int]] | None = None) -> float:
    """Och & Ney: ``1 − (|A∩S| + |A∩P|) / (|A| + |S|)``, with ``P ⊇ S`` (``P = S`` if omitted).

    Example:
        >>> predicted = {(0, 0), (1, 2)}
        >>> alignment_error_rate(predicted, sure={(0, 0)})          # 1 - (1 + 1) / (2 + 1)
        0.33333333333333337
        >>> alignment_error_rate(predicted, sure={(0, 0)}, possible={(1, 2)})  # (1, 2) allowed
        0.0
    """
    possible = sure if possible is None else possible | sure
    if not predicted and not sure:
        raise InputError("AER needs at least one predicted or sure link")
    hits = len(predicted & sure) + len(predicted & possible)
    return 1.0 - hits / (len(predicted) + len(sure))


def attention_aer(attention: torch.Tensor, truth: torch.Tensor) -> float:
    """AER of the argmax links of ``attention [target, source]`` against ``t -> π(t)``.

    Example:
        >>> attention = torch.tensor([[0.7, 0.2, 0.1],    # [target, source]
        ...                           [0.1, 0.3, 0.6],
        ...                           [0.2, 0.5, 0.3]])
        >>> round(attention_aer(attention, torch.tensor([0, 1, 1])), 4)  # 2 of 3 links: 1 - 4/6
        0.3333
    """
    _check(attention, truth)
    predicted = {(t, int(j)) for t, j in enumerate(attention.argmax(-1))}
    sure = {(t, int(j)) for t, j in enumerate(truth)}
    return alignment_error_rate(predicted, sure)


def _ngrams(tokens: Sequence[int], n: int) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def corpus_bleu(candidates: Sequence[Sequence[int]], references: Sequence[Sequence[int]],
                max_n: int = 4) -> float:
    """Corpus BLEU (Papineni et al. 2002) in [0, 100]: clipped n-gram precisions up to
    ``max_n``, geometric mean, brevity penalty; one reference per candidate, no smoothing.

    Example:
        >>> corpus_bleu([[3, 4, 5, 6, 7]], [[3, 4, 5, 6, 7]])     # a perfect match
        100.0
        >>> corpus_bleu([[3, 4, 5, 6, 7]], [[7, 6, 5, 4, 3]])     # no 2-gram in common
        0.0
    """
    if len(candidates) != len(references) or not candidates:
        raise InputError(f"need as many candidates as references (≥ 1); got {len(candidates)} "
                         f"and {len(references)}")
    matches, totals = [0] * max_n, [0] * max_n
    cand_len = ref_len = 0
    for cand, ref in zip(candidates, references, strict=True):
        cand_len += len(cand)
        ref_len += len(ref)
        for n in range(1, max_n + 1):
            ref_counts = _ngrams(ref, n)
            cand_counts = _ngrams(cand, n)
            matches[n - 1] += sum(min(c, ref_counts[g]) for g, c in cand_counts.items())
            totals[n - 1] += max(0, len(cand) - n + 1)
    if min(matches) == 0:
        return 0.0
    log_precision = sum(math.log(m / t) for m, t in zip(matches, totals, strict=True)) / max_n
    brevity = 1.0 if cand_len > ref_len else math.exp(1 - ref_len / max(cand_len, 1))
    return 100.0 * brevity * math.exp(log_precision)


def sequence_accuracy(candidates: Sequence[Sequence[int]],
                      references: Sequence[Sequence[int]]) -> float:
    """Fraction of candidates exactly equal to their reference.

    Example:
        >>> sequence_accuracy([[3, 4], [5, 6]], [[3, 4], [6, 5]])
        0.5
    """
    if len(candidates) != len(references) or not candidates:
        raise InputError("need as many candidates as references (≥ 1)")
    return sum(list(c) == list(r) for c, r in zip(candidates, references, strict=True)) \
        / len(candidates)
