"""A small pre-LayerNorm Transformer (encoder or decoder-only), nanoGPT style.

Hook paths: ``blocks.{i}.attn.hook_scores`` and ``blocks.{i}.attn.hook_pattern``, both
``[batch, head, query, key]``.

Padding: positions count only real tokens (``cumsum(mask) - 1``), padding keys are masked and
padding queries attend only to themselves (``MultiHeadAttention.build_mask``), so left- and
right-padded batches give the same attention and logits on their real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from attnprobe.errors import InputError
from attnprobe.models.attention import MultiHeadAttention
from attnprobe.models.inputs import ConfigSizes, check_sizes, check_token_positions


@dataclass
class TransformerConfig:
    """Hyperparameters of :class:`TransformerModel`.

    ``n_kv_heads`` < ``n_heads`` gives grouped-query attention; ``positional`` is learned
    absolute position embeddings (the only kind this model implements).
    """

    vocab_size: int
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None
    d_ff: int = 64
    max_len: int = 64
    causal: bool = False
    positional: Literal["learned"] = "learned"
    bias: bool = True

    def __post_init__(self) -> None:
        if self.positional != "learned":
            raise InputError(f"positional must be 'learned'; got {self.positional!r}")
        check_sizes(self, "vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len")


class MLP(nn.Module):
    """Position-wise feed-forward: ``[batch, seq, d_model] -> [batch, seq, d_model]``."""

    def __init__(self, d_model: int, d_ff: int, *, bias: bool = True) -> None:
        super().__init__()
        self.fc_in = nn.Linear(d_model, d_ff, bias=bias)
        self.act = nn.GELU()
        self.fc_out = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.act(self.fc_in(x)))


class Block(nn.Module):
    """Pre-LayerNorm block: ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``.

    ``attn`` defaults to the config's :class:`MultiHeadAttention`, made causal per call when
    ``config.causal``. The sparse and linear families pass their own layer, which carries its
    own causality (a causal sliding window, a causal linear layer) and is called as
    ``attn(x, key_padding_mask=..., causal=False)``.
    """

    def __init__(self, config: TransformerConfig, attn: nn.Module | None = None) -> None:
        super().__init__()
        self.causal = config.causal and attn is None
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = attn if attn is not None else MultiHeadAttention(
            config.d_model, config.n_heads, config.n_kv_heads, bias=config.bias
        )
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config.d_model, config.d_ff, bias=config.bias)

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x ``[batch, seq, d_model]``, padding_mask ``[batch, seq]`` (1 = real) -> like x."""
        x = x + self.attn(self.ln1(x), key_padding_mask=padding_mask, causal=self.causal)
        x = x + self.mlp(self.ln2(x))
        return x


class TransformerBody(ConfigSizes, nn.Module):
    """Token + learned position embeddings, ``n_layers`` blocks and a final LayerNorm: the
    model up to its output layer (:class:`TransformerModel` adds the unembedding, the
    ``TransformerClassifier`` a class head)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_embed = nn.Embedding(config.max_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_final = nn.LayerNorm(config.d_model)

    def hidden(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Final states ``[batch, seq, d_model]`` and the bool real-token mask ``[batch, seq]``.

        Raises:
            InputError: wrong shapes or dtypes, ids out of range, ``seq > max_len``, or an
                example whose attention mask is all zeros.
        """
        # real: bool [batch, seq]; positions: [batch, seq] among the real tokens
        real, positions = check_token_positions(input_ids, attention_mask, self.config)
        x = self.embed(input_ids) + self.pos_embed(positions)  # [batch, seq, d_model]
        for block in self.blocks:
            x = block(x, real)
        return self.ln_final(x), real  # [batch, seq, d_model], [batch, seq]


class TransformerModel(TransformerBody):
    """Token + learned position embeddings, ``n_layers`` blocks, final LayerNorm, unembedding.

    Shapes:
        input_ids ``[batch, seq]``, attention_mask ``[batch, seq]`` (1 = real token)
        -> logits ``[batch, seq, vocab]``.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        self.unembed = nn.Linear(config.d_model, config.vocab_size, bias=config.bias)

    @classmethod
    def encoder(cls, vocab_size: int, **overrides: Any) -> TransformerModel:
        """A bidirectional encoder (``causal=False``); other config fields from ``overrides``."""
        return cls(TransformerConfig(vocab_size=vocab_size, causal=False, **overrides))

    @classmethod
    def decoder_only(cls, vocab_size: int, **overrides: Any) -> TransformerModel:
        """A causal decoder-only model (``causal=True``); other fields from ``overrides``."""
        return cls(TransformerConfig(vocab_size=vocab_size, causal=True, **overrides))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits for every position.

        Args:
            input_ids: LongTensor ``[batch, seq]``.
            attention_mask: ``[batch, seq]`` 0/1 or bool, 1 = real token; None = all real.

        Returns:
            logits ``[batch, seq, vocab]`` (rows at padding positions are finite but meaningless).

        Raises:
            InputError: as :meth:`TransformerBody.hidden`.
        """
        x, _ = self.hidden(input_ids, attention_mask)  # [batch, seq, d_model]
        return self.unembed(x)  # [batch, seq, vocab]
