"""A LLaMA-style decoder-only model: pre-norm RMSNorm, SwiGLU MLP, RoPE, grouped-query attention.

Query head ``h`` shares key/value head ``h // (n_heads // n_kv_heads)``; ``n_kv_heads=1`` is
multi-query attention (MQA), ``n_kv_heads=n_heads`` plain multi-head attention. RoPE uses the
half-split pairing of :func:`attnprobe.models.positional.apply_rope`. No linear layer has a bias.

Hook paths: ``blocks.{i}.attn.hook_scores`` / ``blocks.{i}.attn.hook_pattern``,
``[batch, head, query, key]``, causal. Positions count real tokens only, so left and right
padding give the same results on real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnprobe.errors import InputError
from attnprobe.models.inputs import ConfigSizes, check_sizes, check_token_positions
from attnprobe.models.positional import PositionalAttention
from attnprobe.models.tokenizer import WordTokenizer
from attnprobe.models.zoo import REFERENCE_MODELS, seeded_reference


@dataclass
class LlamaConfig:
    """Hyperparameters of :class:`LlamaModel`; ``d_ff`` is the SwiGLU hidden width;
    ``attention_only`` drops the MLPs (the blocks of Elhage et al.'s circuit analyses)."""

    vocab_size: int
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 64
    max_len: int = 64
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    causal: bool = True
    attention_only: bool = False

    def __post_init__(self) -> None:
        check_sizes(self, "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff",
                    "max_len")
        if self.n_heads % self.n_kv_heads:
            raise InputError(f"n_heads={self.n_heads} must be divisible by "
                             f"n_kv_heads={self.n_kv_heads}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise InputError(f"d_model={self.d_model} must split into n_heads={self.n_heads} "
                             "heads of even size (RoPE rotates pairs)")
        if not self.causal:
            raise InputError("LlamaConfig is a causal decoder; causal must be True")


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x²) + eps) · weight`` over the last axis (no mean subtraction, no bias)."""

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``: ``[batch, seq, d_model] -> [batch, seq, d_model]``."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    """Pre-norm: ``x + attn(norm1(x))`` then ``x + mlp(norm2(x))`` (no MLP when
    ``attention_only``)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.norm1 = RMSNorm(config.d_model, config.norm_eps)
        self.attn = PositionalAttention(config.d_model, config.n_heads, config.n_kv_heads,
                                        rope=True, rope_base=config.rope_base, bias=False)
        if not config.attention_only:
            self.norm2 = RMSNorm(config.d_model, config.norm_eps)
            self.mlp = SwiGLU(config.d_model, config.d_ff)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """x ``[batch, seq, d_model]``, positions / real ``[batch, seq]`` -> like x."""
        x = x + self.attn(self.norm1(x), positions, real, causal=True)
        if hasattr(self, "mlp"):
            x = x + self.mlp(self.norm2(x))
        return x


class LlamaModel(ConfigSizes, nn.Module):
    """Token embedding, ``n_layers`` :class:`LlamaBlock`, final RMSNorm, unembedding.

    Shapes:
        input_ids / attention_mask ``[batch, seq]`` (1 = real) -> logits ``[batch, seq, vocab]``.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(LlamaBlock(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.unembed = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]`` (finite but meaningless on padding rows)."""
        # real: bool [batch, seq]; positions: [batch, seq] among the real tokens
        real, positions = check_token_positions(input_ids, attention_mask, self.config)
        x = self.embed(input_ids)  # [batch, seq, d_model]
        for block in self.blocks:
            x = block(x, positions, real)
        return self.unembed(self.norm(x))  # [batch, seq, vocab]


def _build(name: str, seed: int, n_kv_heads: int) -> tuple[nn.Module, WordTokenizer]:
    tokenizer = WordTokenizer()
    return seeded_reference(name, seed, tokenizer, lambda: LlamaModel(LlamaConfig(
        len(tokenizer), n_kv_heads=n_kv_heads, max_len=tokenizer.model_max_length)))


@REFERENCE_MODELS.register("llama")
def llama(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """A 2-layer LLaMA-style decoder: RMSNorm, SwiGLU, RoPE, 4 query heads on 2 KV heads (GQA)."""
    return _build("llama", seed, n_kv_heads=2)


@REFERENCE_MODELS.register("mqa")
def mqa(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """The LLaMA-style decoder with multi-query attention: 4 query heads share 1 KV head."""
    return _build("mqa", seed, n_kv_heads=1)
