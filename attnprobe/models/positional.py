"""Positional information: sinusoidal tables, rotary embeddings (RoPE) and ALiBi biases.

Self-attention by itself is permutation-*equivariant*: permute the tokens and the outputs and
``[query, key]`` maps permute the same way, so word order is invisible. Each scheme here breaks
that symmetry in a different place:

- sinusoidal (Vaswani et al. 2017): a fixed table added to the token embeddings;
- RoPE (Su et al. 2021): q and k rotated by an angle proportional to their position, so
  ``q·k`` depends only on the offset between them;
- ALiBi (Press et al. 2022): ``-slope · distance`` added to the scores, one slope per head.

:class:`PositionalModel` is one small pre-LayerNorm Transformer for all four choices
(``positional="none"`` keeps the symmetry). Hook paths: ``blocks.{i}.attn.hook_scores`` (with
the ALiBi bias already added) and ``blocks.{i}.attn.hook_pattern``, ``[batch, head, query, key]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from attnprobe.errors import InputError
from attnprobe.models.attention import MultiHeadAttention, scaled_dot_product
from attnprobe.models.inputs import ConfigSizes, check_sizes, check_token_positions
from attnprobe.models.tokenizer import WordTokenizer
from attnprobe.models.transformer import MLP
from attnprobe.models.zoo import REFERENCE_MODELS, seeded_reference

Positional = Literal["sinusoidal", "rope", "alibi", "none"]


def sinusoidal_table(n_positions: int, d_model: int) -> torch.Tensor:
    """``[n_positions, d_model]`` with ``PE[pos, 2i] = sin(pos / 10000^(2i/d))`` and
    ``PE[pos, 2i+1] = cos(pos / 10000^(2i/d))`` (an odd ``d_model`` ends on a sine column)."""
    if n_positions < 1 or d_model < 1:
        raise InputError(f"need n_positions >= 1 and d_model >= 1; got {n_positions}, {d_model}")
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]  # [pos, 1]
    freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # [ceil(d/2)]
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: d_model // 2])
    return table.float()


def apply_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate feature pairs of ``x`` by ``position · θ_i`` with ``θ_i = base^(-2i/d)``.

    Pairing is **half-split** (GPT-NeoX / HuggingFace LLaMA ``rotate_half``): feature ``i`` is
    paired with feature ``i + d/2`` for ``i < d/2``, not ``2i`` with ``2i+1`` (interleaved, as
    in the RoPE paper). Both give scores that depend only on the relative offset.

    Args:
        x: ``[batch, head, seq, d]``, ``d`` even.
        positions: ``[batch, seq]`` or ``[seq]`` integer or float positions.
        base: the frequency base.

    Returns:
        like ``x``; every pair keeps its norm.
    """
    if x.ndim != 4 or x.shape[-1] % 2:
        raise InputError(f"x must be [batch, head, seq, d] with d even; got {tuple(x.shape)}")
    batch, _, seq, d = x.shape
    if positions.ndim == 1:
        positions = positions[None]  # [1, seq]
    if positions.ndim != 2 or positions.shape[-1] != seq or positions.shape[0] not in (1, batch):
        raise InputError(
            f"positions must be [seq={seq}] or [batch={batch}, seq={seq}]; "
            f"got {tuple(positions.shape)}"
        )
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)  # [d/2]
    angle = positions.to(x.device, torch.float32)[:, None, :, None] * theta  # [b, 1, seq, d/2]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    first, second = x[..., : d // 2], x[..., d // 2 :]  # [batch, head, seq, d/2] each
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi head slopes ``[n_heads]``: ``2^(-8/n), 2^(-16/n), ..., 2^-8`` for a power of two.

    Otherwise (Press et al.'s reference code): the slopes of the largest power of two
    ``p < n_heads``, then every other slope of ``2p`` heads until there are ``n_heads``.
    """
    if n_heads < 1:
        raise InputError(f"n_heads must be >= 1; got {n_heads}")
    p = 2 ** math.floor(math.log2(n_heads))
    slopes = [2.0 ** (-8.0 * (i + 1) / p) for i in range(p)]
    if p < n_heads:
        slopes += alibi_slopes(2 * p)[0::2][: n_heads - p].tolist()
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: torch.Tensor, n_query: int, n_key: int) -> torch.Tensor:
    """``[head, query, key]`` bias ``-slope_h · |i - j|`` for query ``i`` and key ``j``.

    The symmetric form serves bidirectional attention too. Under a causal mask only ``j <= i``
    is used, where it equals Press et al.'s causal ``-slope · (i - j)`` (their code adds
    ``slope · j``, which differs by a per-row constant and gives the same softmax).
    """
    i = torch.arange(n_query, device=slopes.device)[:, None]  # [query, 1]
    j = torch.arange(n_key, device=slopes.device)[None, :]  # [1, key]
    distance = (i - j).abs().to(slopes.dtype)  # [query, key]
    return -slopes[:, None, None] * distance  # [head, query, key]


class PositionalAttention(MultiHeadAttention):
    """Multi-head (or grouped-query) self-attention with optional RoPE on q/k and ALiBi bias.

    Same projections and hook points as :class:`MultiHeadAttention`; ``rope`` rotates q and k
    (:func:`apply_rope`) before ``scaled_dot_product``; ``alibi`` adds :func:`alibi_bias` to the
    scores before ``hook_scores`` (its ``bias`` argument).

    Shapes:
        x ``[batch, seq, d_model]``, positions ``[batch, seq]`` -> ``[batch, seq, d_model]``.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, *,
                 rope: bool = False, alibi: bool = False, rope_base: float = 10000.0,
                 bias: bool = True) -> None:
        super().__init__(d_model, n_heads, n_kv_heads, bias=bias)
        if rope and self.d_head % 2:
            raise InputError(f"RoPE needs an even head size; got d_head={self.d_head}")
        self.rope, self.rope_base = rope, rope_base
        self.register_buffer("slopes", alibi_slopes(n_heads) if alibi else None, persistent=False)

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        *,
        causal: bool = False,
    ) -> torch.Tensor:
        """x ``[batch, seq, d_model]``; positions default ``0..seq-1``; key_padding_mask
        ``[batch, seq]`` 1 = real. Returns ``[batch, seq, d_model]``."""
        # q [batch, head, seq, d_head]; k, v [batch, kv_head, seq, d_head]
        q, k, v = self.project(x)
        batch, _, seq, _ = q.shape
        if self.rope:
            pos = torch.arange(seq, device=x.device) if positions is None else positions
            q, k = apply_rope(q, pos, self.rope_base), apply_rope(k, pos, self.rope_base)
        q, k, v = self.hooked(q, k, v)
        # GQA as in expand_kv, but always a copy (also for group 1): contiguous k and v keep
        # the gradients bit-identical to the earlier versions of these models
        group = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(group, dim=1)  # [batch, head, seq, d_head]
        v = v.repeat_interleave(group, dim=1)  # [batch, head, seq, d_head]
        mask = self.build_mask(None, key_padding_mask, (batch, seq, seq), causal=causal,
                               self_attention=True, device=x.device)
        bias = None if self.slopes is None else alibi_bias(self.slopes, seq, seq)  # [h, q, k]
        z = scaled_dot_product(q, k, v, mask, self.hook_scores, self.hook_pattern,
                               bias=bias)  # [batch, head, seq, d_head]
        return self.merge(z)  # [batch, seq, d_model]


@dataclass
class PositionalConfig:
    """Hyperparameters of :class:`PositionalModel`; ``positional`` picks the scheme."""

    vocab_size: int
    positional: Positional = "sinusoidal"
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 64
    max_len: int = 64
    causal: bool = False
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        if self.positional not in ("sinusoidal", "rope", "alibi", "none"):
            raise InputError("positional must be 'sinusoidal', 'rope', 'alibi' or 'none'; "
                             f"got {self.positional!r}")
        check_sizes(self, "vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len")


class PositionalBlock(nn.Module):
    """Pre-LayerNorm block: ``x + attn(ln1(x), positions)`` then ``x + mlp(ln2(x))``."""

    def __init__(self, config: PositionalConfig) -> None:
        super().__init__()
        self.causal = config.causal
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = PositionalAttention(config.d_model, config.n_heads,
                                        rope=config.positional == "rope",
                                        alibi=config.positional == "alibi",
                                        rope_base=config.rope_base)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config.d_model, config.d_ff)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """x ``[batch, seq, d_model]``, positions / real ``[batch, seq]`` -> like x."""
        x = x + self.attn(self.ln1(x), positions, real, causal=self.causal)
        return x + self.mlp(self.ln2(x))


class PositionalModel(ConfigSizes, nn.Module):
    """Token embeddings (+ the sinusoidal table if chosen), blocks, final LayerNorm, unembedding.

    Positions count real tokens only (:func:`~attnprobe.models.inputs.positions_from_mask`),
    so left and right padding give the same results on real tokens.

    Shapes:
        input_ids / attention_mask ``[batch, seq]`` -> logits ``[batch, seq, vocab]``.
    """

    def __init__(self, config: PositionalConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        table = sinusoidal_table(config.max_len, config.d_model)
        self.register_buffer("pos_table", table if config.positional == "sinusoidal" else None,
                             persistent=False)  # [max_len, d_model] or None
        self.blocks = nn.ModuleList(PositionalBlock(config) for _ in range(config.n_layers))
        self.ln_final = nn.LayerNorm(config.d_model)
        self.unembed = nn.Linear(config.d_model, config.vocab_size)

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]`` (finite but meaningless on padding rows)."""
        # real: bool [batch, seq]; positions: [batch, seq] among the real tokens
        real, positions = check_token_positions(input_ids, attention_mask, self.config)
        x = self.embed(input_ids)  # [batch, seq, d_model]
        if self.pos_table is not None:
            x = x + self.pos_table[positions]
        for block in self.blocks:
            x = block(x, positions, real)
        return self.unembed(self.ln_final(x))  # [batch, seq, vocab]


def _build(name: str, seed: int, positional: Positional,
           causal: bool = False) -> tuple[nn.Module, WordTokenizer]:
    tokenizer = WordTokenizer()
    return seeded_reference(name, seed, tokenizer, lambda: PositionalModel(PositionalConfig(
        len(tokenizer), positional, causal=causal, max_len=tokenizer.model_max_length)))


@REFERENCE_MODELS.register("sinusoidal")
def sinusoidal(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """A 2-layer, 4-head encoder with the fixed sinusoidal position table (Vaswani et al.)."""
    return _build("sinusoidal", seed, "sinusoidal")


@REFERENCE_MODELS.register("rope")
def rope(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """A 2-layer, 4-head encoder with rotary position embeddings on q and k (RoPE)."""
    return _build("rope", seed, "rope")


@REFERENCE_MODELS.register("alibi")
def alibi(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """A 2-layer, 4-head causal decoder with ALiBi distance biases on the scores."""
    return _build("alibi", seed, "alibi", causal=True)


@REFERENCE_MODELS.register("nopos")
def nopos(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """A 2-layer, 4-head encoder with no positional information (permutation-equivariant)."""
    return _build("nopos", seed, "none")
