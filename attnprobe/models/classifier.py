"""Small attention classifiers over WordTokenizer ids, for attention-vs-attribution studies.

Both take ``forward(input_ids, attention_mask=None) -> logits [batch, n_classes]``.

:class:`AttentionClassifier` is Jain & Wallace's (2019) text classifier: embedding ->
encoder -> one additive (``tanh``) attention layer with a learned context vector -> linear::

    h_t = encoder(e_1 .. e_n)_t
    s_t = v_aᵀ tanh(W_a q + U_a h_t)            # q: a learned query (context vector)
    α   = softmax_t(s)        over the words     # [BOS] and padding get exactly 0
    ŷ   = W_o Σ_t α_t h_t + b_o

With a learned ``q``, ``W_a q + b`` is one learned bias, so the score is exactly J&W's
``TanhAttention`` ``v_aᵀ tanh(U_a h_t + b)`` (their ``attn1``/``attn2``; ``d_attn`` defaults
to half the state size, as there). Encoders:

- ``"bilstm"``: a bidirectional LSTM (J&W's ``rnn``), ``h_t`` = both directions
  concatenated; padding anywhere in the row is skipped (the real tokens are packed).
- ``"average"``: no context at all, ``h_t = tanh(W e_t + b)`` (J&W's ``average`` encoder
  with ``projection`` and ``tanh``): each state sees only its own word.

Like J&W (whose masks cover ``<SOS>`` and ``<EOS>``), the attention skips the ``[BOS]`` token
(ids equal to ``bos_id``; ``attend_bos=True`` keeps it); the BiLSTM still reads it. Hook paths
(one layer, one head, one query): ``attention.hook_scores`` and ``attention.hook_pattern``,
``[batch, 1, 1, key]``.

:class:`TransformerClassifier`: the reference pre-LayerNorm encoder blocks
(:class:`~attnprobe.models.transformer.Block`, bidirectional) with learned positions, a final
LayerNorm, then the state at the ``[BOS]`` position (the first real token, CLS-like) or the
mean over real tokens, then a linear layer. Hook paths ``blocks.{i}.attn.hook_pattern``.

Zoo entries (untrained, seeded; tokenizer over the key-token vocabulary,
:func:`keytoken_tokenizer`): ``bilstm-classifier``, ``average-classifier``,
``transformer-classifier``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from attnprobe.errors import InputError
from attnprobe.models.inputs import ConfigSizes, check_sizes, check_token_inputs
from attnprobe.models.rnn_attention import BahdanauAttention, real_first, run_packed
from attnprobe.models.tokenizer import KEYTOKEN_WORDS, WordTokenizer
from attnprobe.models.transformer import TransformerBody, TransformerConfig
from attnprobe.models.zoo import REFERENCE_MODELS, seeded_reference

Encoder = Literal["bilstm", "average"]
Pooling = Literal["bos", "mean"]


def keytoken_tokenizer(model_max_length: int = 64) -> WordTokenizer:
    """A WordTokenizer over every word of the key-token tasks (``attnprobe.tasks.keytoken``)."""
    return WordTokenizer(KEYTOKEN_WORDS, model_max_length=model_max_length)


# ------------------------------------------------------------------ Jain & Wallace
@dataclass
class AttentionClassifierConfig:
    """Hyperparameters of :class:`AttentionClassifier`.

    ``d_hidden`` is the LSTM size per direction (``bilstm``, states ``2 * d_hidden``) or the
    projection size (``average``). ``d_attn`` defaults to half the state size (J&W).
    """

    vocab_size: int
    encoder: Encoder = "bilstm"
    d_embed: int = 32
    d_hidden: int = 32
    d_attn: int | None = None
    n_classes: int = 2
    attend_bos: bool = False
    bos_id: int = WordTokenizer.bos_token_id
    n_layers: int = 1
    n_heads: int = 1
    causal: bool = False

    def __post_init__(self) -> None:
        if self.encoder not in ("bilstm", "average"):
            raise InputError(f"encoder must be 'bilstm' or 'average'; got {self.encoder!r}")
        check_sizes(self, "vocab_size", "d_embed", "d_hidden", "n_classes")
        if self.d_attn is not None and self.d_attn < 1:
            raise InputError(f"d_attn must be >= 1; got {self.d_attn}")

    @property
    def d_state(self) -> int:
        return 2 * self.d_hidden if self.encoder == "bilstm" else self.d_hidden


class AttentionClassifier(ConfigSizes, nn.Module):
    """Embedding -> BiLSTM or per-token projection -> additive attention pooling -> linear.

    Shapes:
        input_ids ``[batch, seq]``, attention_mask ``[batch, seq]`` (1 = real; any padding
        side) -> logits ``[batch, n_classes]``. Hook paths ``attention.hook_scores`` /
        ``attention.hook_pattern`` ``[batch, 1, 1, seq]``.
    """

    def __init__(self, config: AttentionClassifierConfig) -> None:
        super().__init__()
        self.config = config
        d_state = config.d_state
        d_attn = config.d_attn or max(1, d_state // 2)
        self.embed = nn.Embedding(config.vocab_size, config.d_embed, padding_idx=0)
        if config.encoder == "bilstm":
            self.lstm = nn.LSTM(config.d_embed, config.d_hidden, batch_first=True,
                                bidirectional=True)
        else:
            self.projection = nn.Linear(config.d_embed, config.d_hidden)
        self.query = nn.Parameter(torch.randn(d_attn) / math.sqrt(d_attn))
        self.attention = BahdanauAttention(d_attn, d_state, d_attn)
        self.classifier = nn.Linear(d_state, config.n_classes)

    def encode(self, embedded: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """States ``[batch, seq, d_state]`` of embeddings ``[batch, seq, d_embed]``; padding
        positions get zeros (``bilstm``) or the projection of the padding embedding."""
        if self.config.encoder == "average":
            return torch.tanh(self.projection(embedded))
        order = real_first(real)  # [batch, seq]: each row's real tokens first
        front = embedded.gather(1, order[..., None].expand_as(embedded))  # [batch, seq, d_embed]
        states, _ = run_packed(self.lstm, front, real, order)  # [batch, seq, d_state]
        return states

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Class logits ``[batch, n_classes]``.

        Raises:
            InputError: bad ids or mask, or an example with no token to attend to (only
                ``[BOS]``, when ``attend_bos`` is False).
        """
        real = check_token_inputs(input_ids, attention_mask, vocab_size=self.config.vocab_size)
        attend = real if self.config.attend_bos else real & (input_ids != self.config.bos_id)
        empty = (~attend.any(dim=1)).nonzero().flatten().tolist()
        if empty:
            raise InputError(f"example(s) {empty} have no word besides [BOS] to attend to")
        states = self.encode(self.embed(input_ids), real)  # [batch, seq, d_state]
        query = self.query.expand(input_ids.shape[0], -1)  # [batch, d_attn]
        context, _ = self.attention(query, states, attend)  # [batch, d_state]
        return self.classifier(context)  # [batch, n_classes]


# ------------------------------------------------------------------ Transformer
@dataclass
class TransformerClassifierConfig(TransformerConfig):
    """:class:`~attnprobe.models.transformer.TransformerConfig` plus the pooling and the
    number of classes (2 layers × 2 heads by default; always bidirectional)."""

    n_heads: int = 2
    pooling: Pooling = "bos"
    n_classes: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.causal:
            raise InputError("TransformerClassifier is bidirectional; causal must be False")
        if self.pooling not in ("bos", "mean"):
            raise InputError(f"pooling must be 'bos' or 'mean'; got {self.pooling!r}")
        if self.n_classes < 1:
            raise InputError(f"n_classes must be >= 1; got {self.n_classes}")


class TransformerClassifier(TransformerBody):
    """Token + learned position embeddings -> encoder blocks -> LayerNorm -> pool -> linear.

    Pooling ``"bos"`` reads the first real token of each row (``[BOS]`` for WordTokenizer
    input, left or right padded); ``"mean"`` averages the real tokens.

    Shapes:
        input_ids ``[batch, seq]``, attention_mask ``[batch, seq]`` (1 = real)
        -> logits ``[batch, n_classes]``. Hook paths ``blocks.{i}.attn.hook_pattern``.
    """

    config: TransformerClassifierConfig

    def __init__(self, config: TransformerClassifierConfig) -> None:
        super().__init__(config)  # embed, pos_embed, blocks, ln_final
        self.classifier = nn.Linear(config.d_model, config.n_classes)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Class logits ``[batch, n_classes]``; InputError on bad ids/mask or ``seq > max_len``."""
        x, real = self.hidden(input_ids, attention_mask)  # [batch, seq, d_model], [batch, seq]
        if self.config.pooling == "bos":
            first = real.to(torch.int8).argmax(dim=1)  # [batch] first real position
            pooled = x[torch.arange(x.shape[0], device=x.device), first]
        else:
            weights = real.to(x.dtype)
            pooled = (x * weights[..., None]).sum(1) / weights.sum(1, keepdim=True)
        return self.classifier(pooled)  # [batch, n_classes]


# ------------------------------------------------------------------ zoo
def _build(name: str, seed: int, make) -> tuple[nn.Module, WordTokenizer]:
    tokenizer = keytoken_tokenizer()
    return seeded_reference(name, seed, tokenizer,
                            lambda: make(len(tokenizer), tokenizer.model_max_length))


@REFERENCE_MODELS.register("bilstm-classifier")
def bilstm_classifier(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """Jain & Wallace's BiLSTM + additive (tanh) attention text classifier (untrained)."""
    return _build("bilstm-classifier", seed, lambda vocab, _: AttentionClassifier(
        AttentionClassifierConfig(vocab_size=vocab, encoder="bilstm")))


@REFERENCE_MODELS.register("average-classifier")
def average_classifier(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """Jain & Wallace's non-contextual "average" encoder + additive attention (untrained)."""
    return _build("average-classifier", seed, lambda vocab, _: AttentionClassifier(
        AttentionClassifierConfig(vocab_size=vocab, encoder="average")))


@REFERENCE_MODELS.register("transformer-classifier")
def transformer_classifier(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """A 2-layer, 2-head bidirectional encoder pooled at [BOS] (untrained)."""
    return _build("transformer-classifier", seed, lambda vocab, max_len: TransformerClassifier(
        TransformerClassifierConfig(vocab_size=vocab, max_len=max_len)))
