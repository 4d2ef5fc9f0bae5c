"""Query-weighted pooling: the minimal attention of seed 000.

One query vector is compared with every state, the scores go through a masked softmax, and the
context is the weighted sum of the states::

    scores_i = similarity(query, state_i)         # dot product, optionally / sqrt(d)
    weights  = softmax(scores)                    # padding keys get exactly 0
    context  = sum_i weights_i * state_i

Hook paths (single query, so head = query = 1): ``pool.hook_scores`` (pre-softmax, pre-mask)
and ``pool.hook_pattern`` (post-softmax), both ``[batch, 1, 1, seq]``.

The helpers :func:`real_keys` and :func:`attend_single_query` are shared with the RNN
attention modules (``attnprobe.models.rnn_attention``), which also have one query per call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from attnprobe.core.hook_point import HookPoint
from attnprobe.errors import InputError
from attnprobe.models.inputs import check_key_padding_mask, check_sizes, check_token_inputs
from attnprobe.models.tokenizer import WordTokenizer
from attnprobe.models.zoo import REFERENCE_MODELS, seeded_reference


def real_keys(
    key_padding_mask: torch.Tensor | None, batch: int, n_key: int, device: torch.device
) -> torch.Tensor | None:
    """Validate a ``[batch, key]`` 0/1 (or bool) mask, 1 = real; return it as bool or None.

    Stricter than :func:`~attnprobe.models.inputs.check_key_padding_mask`: only 0 and 1."""
    real = check_key_padding_mask(key_padding_mask, batch, n_key, device)  # [batch, key]
    if real is not None and not bool(((key_padding_mask == 0) | (key_padding_mask == 1)).all()):
        raise InputError("key_padding_mask must contain only 0/1 (or bool); 1 = real token")
    return real


def attend_single_query(
    scores: torch.Tensor,
    values: torch.Tensor,
    allowed: torch.Tensor | None,
    hook_scores: HookPoint,
    hook_pattern: HookPoint,
    *,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax over one query's scores and the weighted sum of ``values``.

    Args:
        scores: ``[batch, key]`` similarity of the query to each key (sent to ``hook_scores``
            as ``[batch, 1, 1, key]`` before the bias and the mask).
        values: ``[batch, key, d]``.
        allowed: bool ``[batch, key]``, True = may attend, or None (all keys).
        bias: optional ``[batch, key]`` added to the scores after ``hook_scores`` (e.g. a
            log-Gaussian location prior).

    Returns:
        ``(context [batch, d], weights [batch, key])``; ``weights`` is what ``hook_pattern``
        returned (``[batch, 1, 1, key]``) squeezed, so an edit there changes the context.

    Raises:
        InputError: a row with no allowed key.
    """
    scores = hook_scores(scores[:, None, None, :])  # [batch, 1, 1, key]
    if bias is not None:
        scores = scores + bias[:, None, None, :]
    if allowed is not None:
        if not bool(allowed.any(dim=-1).all()):
            empty = (~allowed.any(dim=-1)).nonzero().flatten().tolist()
            raise InputError(f"examples {empty} have no key to attend to (fully masked row)")
        scores = scores.masked_fill(~allowed[:, None, None, :], float("-inf"))
    pattern = torch.softmax(scores, dim=-1)  # [batch, 1, 1, key]
    pattern = hook_pattern(pattern)
    weights = pattern[:, 0, 0, :]  # [batch, key]
    context = torch.bmm(weights.unsqueeze(1), values).squeeze(1)  # [batch, d]
    return context, weights


class QueryPooling(nn.Module):
    """``context = Σ_i softmax_i(q · h_i [/ sqrt(d)]) h_i`` for one query per example.

    Args:
        scaled: divide the dot products by ``sqrt(d)`` (seed 000 uses the plain dot product).

    Shapes:
        query ``[batch, d]``, states ``[batch, seq, d]``, key_padding_mask ``[batch, seq]``
        (1 = real) -> ``(context [batch, d], weights [batch, seq])``.
        ``hook_scores`` / ``hook_pattern`` see ``[batch, 1, 1, seq]``.
    """

    def __init__(self, *, scaled: bool = False) -> None:
        super().__init__()
        self.scaled = scaled
        self.hook_scores = HookPoint()  # [batch, 1, 1, seq], pre-softmax
        self.hook_pattern = HookPoint()  # [batch, 1, 1, seq], post-softmax

    def forward(
        self,
        query: torch.Tensor,
        states: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if query.ndim != 2 or states.ndim != 3 or query.shape[0] != states.shape[0] \
                or query.shape[-1] != states.shape[-1]:
            raise InputError(
                "query must be [batch, d] and states [batch, seq, d]; got "
                f"{tuple(query.shape)} and {tuple(states.shape)}"
            )
        batch, seq, d = states.shape
        allowed = real_keys(key_padding_mask, batch, seq, states.device)
        scores = torch.bmm(states, query.unsqueeze(2)).squeeze(2)  # [batch, seq]
        if self.scaled:
            scores = scores / math.sqrt(d)
        return attend_single_query(scores, states, allowed, self.hook_scores, self.hook_pattern)


@dataclass
class PoolingConfig:
    """Hyperparameters of :class:`PoolingClassifier` (one pooling "layer" with one "head")."""

    vocab_size: int
    d_model: int = 32
    n_classes: int = 2
    scaled: bool = False
    n_layers: int = 1
    n_heads: int = 1
    causal: bool = False

    def __post_init__(self) -> None:
        check_sizes(self, "vocab_size", "d_model", "n_classes")


class PoolingClassifier(nn.Module):
    """Token embeddings -> :class:`QueryPooling` with one learned query -> class logits.

    There are no position embeddings: the pooled context is a weighted bag of words, so it is
    unchanged by padding (and by reordering the tokens).

    Shapes:
        input_ids ``[batch, seq]``, attention_mask ``[batch, seq]`` (1 = real)
        -> logits ``[batch, n_classes]``. Hook paths ``pool.hook_scores``/``pool.hook_pattern``.
    """

    def __init__(self, config: PoolingConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.query = nn.Parameter(torch.randn(config.d_model) / math.sqrt(config.d_model))
        self.pool = QueryPooling(scaled=config.scaled)
        self.classifier = nn.Linear(config.d_model, config.n_classes)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Class logits ``[batch, n_classes]`` of each sequence."""
        real = check_token_inputs(input_ids, attention_mask, vocab_size=self.config.vocab_size)
        states = self.embed(input_ids)  # [batch, seq, d_model]
        query = self.query.expand(input_ids.shape[0], -1)  # [batch, d_model]
        context, _ = self.pool(query, states, real)  # [batch, d_model]
        return self.classifier(context)  # [batch, n_classes]


@REFERENCE_MODELS.register("pooling")
def pooling(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """Seed 000's minimal attention: a learned query pools word embeddings for a classifier."""
    tokenizer = WordTokenizer()
    return seeded_reference("pooling", seed, tokenizer,
                            lambda: PoolingClassifier(PoolingConfig(vocab_size=len(tokenizer))))
