"""The original Transformer (Vaswani et al. 2017): an encoder–decoder with post-norm blocks.

- encoder block: ``x = LN(x + self_attn(x))``, ``x = LN(x + ffn(x))``
- decoder block: ``y = LN(y + causal_self_attn(y))``, ``y = LN(y + cross_attn(y, memory))``,
  ``y = LN(y + ffn(y))``
- embeddings scaled by ``sqrt(d_model)`` plus the fixed sinusoidal table; ReLU feed-forward.
  (The paper also ties the embedding and output matrices; here they are separate.)

Hook paths, all ``[batch, head, query, key]``: ``encoder.blocks.{i}.attn.hook_pattern``
(``[.., src, src]``), ``decoder.blocks.{i}.self_attn.hook_pattern`` (``[.., tgt, tgt]``, causal)
and ``decoder.blocks.{i}.cross_attn.hook_pattern`` (``[.., tgt, src]``); ``hook_scores`` next to
each. Positions count real tokens only, so left and right padding give the same results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnprobe.errors import InputError
from attnprobe.models.attention import MultiHeadAttention
from attnprobe.models.inputs import (
    ConfigSizes,
    check_encoder_decoder_inputs,
    check_sizes,
    positions_from_mask,
)
from attnprobe.models.positional import sinusoidal_table
from attnprobe.models.tokenizer import WordTokenizer
from attnprobe.models.zoo import REFERENCE_MODELS, seeded_reference


@dataclass
class EncoderDecoderConfig:
    """Hyperparameters of :class:`EncoderDecoderModel`.

    ``n_layers`` is the depth of each side. ``causal`` describes the encoder (bidirectional);
    the decoder's self-attention is always causal.
    """

    vocab_size: int
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 64
    max_len: int = 64
    causal: bool = False
    is_encoder_decoder: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        check_sizes(self, "vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_len")
        if self.d_model % self.n_heads:
            raise InputError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")

    @classmethod
    def original(cls, vocab_size: int, **overrides: Any) -> EncoderDecoderConfig:
        """The paper's base sizes: d_model 512, 8 heads of 64, d_ff 2048, 6 + 6 layers."""
        sizes: dict[str, Any] = dict(d_model=512, n_heads=8, n_layers=6, d_ff=2048, max_len=512)
        return cls(vocab_size=vocab_size, **{**sizes, **overrides})


class FeedForward(nn.Module):
    """``relu(x W1 + b1) W2 + b2``: ``[batch, seq, d_model] -> [batch, seq, d_model]``."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.fc_in = nn.Linear(d_model, d_ff)
        self.fc_out = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(torch.relu(self.fc_in(x)))


class EncoderBlock(nn.Module):
    """Post-norm: ``x = ln1(x + attn(x))``, ``x = ln2(x + ffn(x))``."""

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(config.d_model, config.n_heads)
        self.ln1 = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config.d_model, config.d_ff)
        self.ln2 = nn.LayerNorm(config.d_model)

    def forward(self, x: torch.Tensor, src_real: torch.Tensor) -> torch.Tensor:
        """x ``[batch, src, d_model]``, src_real ``[batch, src]`` bool -> like x."""
        x = self.ln1(x + self.attn(x, key_padding_mask=src_real))
        return self.ln2(x + self.ffn(x))


class DecoderBlock(nn.Module):
    """Post-norm: causal self-attention, cross-attention to the encoder output, feed-forward."""

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config.d_model, config.n_heads)
        self.ln1 = nn.LayerNorm(config.d_model)
        self.cross_attn = MultiHeadAttention(config.d_model, config.n_heads)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config.d_model, config.d_ff)
        self.ln3 = nn.LayerNorm(config.d_model)

    def forward(self, y: torch.Tensor, memory: torch.Tensor, src_real: torch.Tensor,
                tgt_real: torch.Tensor) -> torch.Tensor:
        """y ``[batch, tgt, d_model]``, memory ``[batch, src, d_model]``, masks bool -> like y."""
        y = self.ln1(y + self.self_attn(y, key_padding_mask=tgt_real, causal=True))
        y = self.ln2(y + self.cross_attn(y, context=memory, key_padding_mask=src_real))
        return self.ln3(y + self.ffn(y))


class Encoder(nn.Module):
    """A stack of :class:`EncoderBlock` named ``blocks``."""

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(EncoderBlock(config) for _ in range(config.n_layers))

    def forward(self, x: torch.Tensor, src_real: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, src_real)
        return x  # [batch, src, d_model]


class Decoder(nn.Module):
    """A stack of :class:`DecoderBlock` named ``blocks``."""

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(DecoderBlock(config) for _ in range(config.n_layers))

    def forward(self, y: torch.Tensor, memory: torch.Tensor, src_real: torch.Tensor,
                tgt_real: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            y = block(y, memory, src_real, tgt_real)
        return y  # [batch, tgt, d_model]


class EncoderDecoderModel(ConfigSizes, nn.Module):
    """Shared token embedding, sinusoidal positions, encoder, decoder, output projection.

    Shapes:
        input_ids / attention_mask ``[batch, src]``, decoder_input_ids /
        decoder_attention_mask ``[batch, tgt]`` (1 = real token) -> logits
        ``[batch, tgt, vocab]``.
    """

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.register_buffer("pos_table", sinusoidal_table(config.max_len, config.d_model),
                             persistent=False)  # [max_len, d_model]
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.unembed = nn.Linear(config.d_model, config.vocab_size)

    @classmethod
    def original(cls, vocab_size: int, **overrides: Any) -> EncoderDecoderModel:
        """The base model of the paper (see :meth:`EncoderDecoderConfig.original`)."""
        return cls(EncoderDecoderConfig.original(vocab_size, **overrides))

    def _embed(self, ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """``[batch, seq]`` ids -> ``embed · sqrt(d_model) + PE[position]`` ``[batch, seq, d]``."""
        scale = math.sqrt(self.config.d_model)
        return self.embed(ids) * scale + self.pos_table[positions_from_mask(real)]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits for every target position (teacher forcing).

        Raises:
            InputError: missing ``decoder_input_ids``, bad shapes or ids, batch sizes that
                differ, too many tokens, or an example with no real token on either side.
        """
        src_real, tgt_real = check_encoder_decoder_inputs(
            input_ids, attention_mask, decoder_input_ids, decoder_attention_mask,
            vocab_size=self.config.vocab_size, max_len=self.config.max_len,
            hint="pass the target prefix (e.g. the source itself, as attnprobe.extract does)",
        )  # [batch, src], [batch, tgt]
        memory = self.encoder(self._embed(input_ids, src_real), src_real)  # [batch, src, d]
        y = self.decoder(self._embed(decoder_input_ids, tgt_real), memory, src_real, tgt_real)
        return self.unembed(y)  # [batch, tgt, vocab]


@REFERENCE_MODELS.register("encoder-decoder")
def encoder_decoder(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """The original post-norm Transformer, tiny: 2 + 2 layers, 4 heads, sinusoidal positions."""
    tokenizer = WordTokenizer()
    return seeded_reference("encoder-decoder", seed, tokenizer, lambda: EncoderDecoderModel(
        EncoderDecoderConfig(len(tokenizer), max_len=tokenizer.model_max_length)))
