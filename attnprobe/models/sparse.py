"""Sparse attention: sliding-window and BigBird (window + global + random) patterns.

Each query attends only the keys its pattern allows; the rest is ordinary scaled dot-product
attention (``MultiHeadAttention`` with an ``attn_mask``), so ``hook_scores`` and
``hook_pattern`` see ``[batch, head, query, key]`` and the pattern is exactly zero outside
the mask.

Conventions (the seed: "each token attends only the tokens within ``w`` positions before
and after it"):

- bidirectional sliding window ``w``: query ``i`` may attend key ``j`` iff ``|i - j| <= w``;
- causal sliding window ``w`` (Mistral style): iff ``0 <= i - j <= w`` (itself and ``w``
  earlier tokens).

This reference implementation materialises the full ``[query, key]`` matrix and masks it,
for readability: memory is O(n²) like full attention (8,192 tokens x 4 heads is ~1 GiB per
copy of the scores). A production kernel would compute only the band. Linear attention
(``attnprobe.models.linear_attention``) is the family that never forms the matrix.

Padding: the pattern is laid over *real-token* positions (``cumsum(mask) - 1``), so left- and
right-padded batches give the same attention on their real tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from attnprobe.errors import InputError
from attnprobe.models.attention import MultiHeadAttention
from attnprobe.models.inputs import check_key_padding_mask, positions_from_mask
from attnprobe.models.tokenizer import WordTokenizer
from attnprobe.models.transformer import Block, TransformerConfig, TransformerModel
from attnprobe.models.zoo import REFERENCE_MODELS, seeded_reference


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"{name} must be a non-negative integer; got {value!r}")


def sliding_window_mask(
    n: int, window: int, *, causal: bool = False, device: torch.device | None = None
) -> torch.Tensor:
    """Bool ``[query, key]`` band mask, True where query ``i`` may attend key ``j``.

    Bidirectional: ``|i - j| <= window``; causal: ``0 <= i - j <= window``. ``window = 0``
    is attention to oneself only; ``window >= n - 1`` (bidirectional) is full attention.

    Raises:
        InputError: ``n < 1``, a negative window, or ``window > n`` (larger than the sequence).
    """
    _check_sizes(n=n, window=window)
    if n < 1:
        raise InputError(f"sequence length must be >= 1; got n={n}")
    if window > n:
        raise InputError(f"window={window} is larger than the sequence (n={n})")
    ones = torch.ones(n, n, dtype=torch.bool, device=device)
    upper = 0 if causal else window
    return ones.tril(diagonal=upper).triu(diagonal=-window)  # [query, key]


def global_tokens_mask(
    n: int, global_idx: Sequence[int] | torch.Tensor, device: torch.device | None = None
) -> torch.Tensor:
    """Bool ``[query, key]``: True in the rows and columns of the global tokens.

    A global token attends to every token and every token attends to it; nothing else is
    allowed (OR it with a local pattern). An empty ``global_idx`` gives an all-False mask.

    Raises:
        InputError: ``n < 1`` or an index outside ``[0, n)``.
    """
    _check_sizes(n=n)
    if n < 1:
        raise InputError(f"sequence length must be >= 1; got n={n}")
    idx = torch.as_tensor(global_idx, dtype=torch.long).flatten()
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise InputError(f"global token indices must lie in [0, {n}); got {idx.tolist()}")
    is_global = torch.zeros(n, dtype=torch.bool, device=device)
    is_global[idx.to(is_global.device)] = True
    return is_global[:, None] | is_global[None, :]  # [query, key]


def bigbird_mask(
    n: int,
    block: int,
    n_random: int,
    window_blocks: int,
    n_global_blocks: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Bool ``[query, key]`` BigBird pattern (Zaheer et al. 2020, ITC variant), in blocks.

    The sequence is cut into ``n // block`` blocks. Query block ``r`` attends key block ``c``
    when any of these holds:

    - window: ``|r - c| <= window_blocks`` (symmetric);
    - global: ``r`` or ``c`` is one of the first ``n_global_blocks`` blocks (symmetric);
    - random: ``c`` is one of ``n_random`` blocks drawn for ``r`` without replacement from
      the blocks the two rules above leave out (all of them if fewer remain). Global query
      blocks already see everything and draw none. Not symmetric.

    The draws come from ``generator``, so the mask is reproducible with a seeded generator.

    Raises:
        InputError: negative sizes, ``block < 1``, ``block`` not dividing ``n``, or more
            window or global blocks than there are blocks.
    """
    _check_sizes(n=n, block=block, n_random=n_random, window_blocks=window_blocks,
                 n_global_blocks=n_global_blocks)
    if block < 1 or n < 1 or n % block:
        raise InputError(f"block={block} must be >= 1 and divide the sequence length n={n}")
    n_blocks = n // block
    if window_blocks > n_blocks or n_global_blocks > n_blocks:
        raise InputError(
            f"window_blocks={window_blocks} and n_global_blocks={n_global_blocks} must not "
            f"exceed the number of blocks {n_blocks} (n={n}, block={block})"
        )
    layout = sliding_window_mask(n_blocks, window_blocks) | global_tokens_mask(
        n_blocks, range(n_global_blocks)
    )  # [query block, key block]
    for r in range(n_global_blocks, n_blocks):
        free = (~layout[r]).nonzero().flatten()  # key blocks not yet attended
        pick = torch.randperm(free.numel(), generator=generator)[:n_random]
        layout[r, free[pick]] = True
    return layout.repeat_interleave(block, 0).repeat_interleave(block, 1)  # [query, key]


class PatternAttention(MultiHeadAttention):
    """Multi-head self-attention restricted to a fixed ``[query, key]`` pattern.

    Subclasses define :meth:`pattern`. The pattern is applied to real-token positions, so
    padding does not shift it; padding keys are masked as in ``MultiHeadAttention``, whose
    ``forward`` this is, with the pattern added to its mask (:meth:`build_mask`).

    Shapes:
        x ``[batch, seq, d_model]`` -> ``[batch, seq, d_model]``; hooks see
        ``[batch, head, query, key]``.
    """

    def pattern(self, n: int, device: torch.device | None = None) -> torch.Tensor:
        """Bool ``[query, key]`` mask for ``n`` real tokens (True = may attend)."""
        raise NotImplementedError

    def build_mask(  # type: ignore[override]
        self, attn_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None,
        sizes: tuple[int, int, int], **flags: Any,
    ) -> torch.Tensor:
        """``MultiHeadAttention.build_mask`` (same arguments) with the pattern over real-token
        positions ANDed into ``attn_mask``; InputError for cross-attention."""
        if not flags["self_attention"]:
            raise InputError(f"{type(self).__name__} is self-attention only; got a context")
        batch, n, _ = sizes  # (batch, query, key), query = key
        allowed = self._positioned(batch, n, key_padding_mask, flags["device"])
        if attn_mask is not None:
            allowed = allowed & attn_mask
        return super().build_mask(allowed, key_padding_mask, sizes, **flags)

    def _positioned(
        self, batch: int, n: int, key_padding_mask: torch.Tensor | None, device: torch.device
    ) -> torch.Tensor:
        """The pattern over real-token positions: ``[query, key]`` or ``[batch, 1, q, k]``."""
        real = check_key_padding_mask(key_padding_mask, batch, n, device)  # [batch, seq]
        if real is None or bool(real.all()):
            return self.pattern(n, device)  # [query, key]
        # Each example gets the pattern of its own real length (BigBird's random blocks depend
        # on it), laid over its real-token positions, so batch-mates never change it.
        lengths = real.sum(dim=1)  # [batch]
        pos = positions_from_mask(real)  # [batch, seq]
        out = torch.zeros(batch, n, n, dtype=torch.bool, device=device)
        for length in lengths.unique().tolist():
            rows = lengths == length
            p = pos[rows].clamp(max=max(length, 1) - 1)  # [rows, seq]
            table = self.pattern(max(length, 1), device)  # [real query, real key]
            out[rows] = table[p[:, :, None], p[:, None, :]]
        return out[:, None]  # [batch, 1, query, key]


class SlidingWindowAttention(PatternAttention):
    """Attention within a band of ``window`` tokens (see :func:`sliding_window_mask`).

    A sequence shorter than the window is attended in full (the window is clipped to it).
    """

    def __init__(
        self, d_model: int, n_heads: int, window: int, *, causal: bool = False, bias: bool = True
    ) -> None:
        super().__init__(d_model, n_heads, bias=bias)
        _check_sizes(window=window)
        self.window = window
        self.causal = causal

    def pattern(self, n: int, device: torch.device | None = None) -> torch.Tensor:
        return sliding_window_mask(n, min(self.window, n), causal=self.causal, device=device)


class BigBirdAttention(PatternAttention):
    """BigBird block-sparse attention (see :func:`bigbird_mask`), bidirectional.

    The random blocks are drawn from a generator seeded with ``seed`` on every call, so a
    given length always gets the same pattern. A length that is not a multiple of ``block``
    uses the pattern of the next multiple, cut to size; window and global counts are clipped
    to the number of blocks.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        block: int,
        n_random: int,
        window_blocks: int,
        n_global_blocks: int,
        seed: int = 0,
        bias: bool = True,
    ) -> None:
        super().__init__(d_model, n_heads, bias=bias)
        _check_sizes(n_random=n_random, window_blocks=window_blocks,
                     n_global_blocks=n_global_blocks)
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise InputError(f"block must be a positive integer; got {block!r}")
        self.block, self.n_random, self.seed = block, n_random, seed
        self.window_blocks, self.n_global_blocks = window_blocks, n_global_blocks

    def pattern(self, n: int, device: torch.device | None = None) -> torch.Tensor:
        n_blocks = math.ceil(n / self.block)
        mask = bigbird_mask(
            n_blocks * self.block,
            self.block,
            self.n_random,
            min(self.window_blocks, n_blocks),
            min(self.n_global_blocks, n_blocks),
            torch.Generator().manual_seed(self.seed),
        )
        return mask[:n, :n].to(device)  # [query, key]


@dataclass
class SparseConfig(TransformerConfig):
    """:class:`TransformerConfig` plus the sparse pattern of every layer.

    ``pattern="sliding"`` uses ``window`` (and ``causal``); ``pattern="bigbird"`` uses
    ``block``, ``n_random``, ``window_blocks``, ``n_global_blocks`` and ``mask_seed`` (layer
    ``i`` draws its random blocks with seed ``mask_seed + i``) and must be bidirectional.
    """

    pattern: Literal["sliding", "bigbird"] = "sliding"
    window: int = 2
    block: int = 2
    n_random: int = 1
    window_blocks: int = 1
    n_global_blocks: int = 1
    mask_seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pattern not in ("sliding", "bigbird"):
            raise InputError(f"pattern must be 'sliding' or 'bigbird'; got {self.pattern!r}")
        if self.pattern == "bigbird" and self.causal:
            raise InputError("the BigBird pattern is bidirectional; set causal=False")


def pattern_attention(config: SparseConfig, layer: int) -> PatternAttention:
    """The attention layer ``layer`` of a :class:`SparseTransformer` with ``config``."""
    if config.pattern == "sliding":
        return SlidingWindowAttention(
            config.d_model, config.n_heads, config.window, causal=config.causal,
            bias=config.bias,
        )
    return BigBirdAttention(
        config.d_model, config.n_heads, block=config.block, n_random=config.n_random,
        window_blocks=config.window_blocks, n_global_blocks=config.n_global_blocks,
        seed=config.mask_seed + layer, bias=config.bias,
    )


class SparseTransformer(TransformerModel):
    """:class:`TransformerModel` whose blocks use sliding-window or BigBird attention.

    Same inputs, outputs and hook paths (``blocks.{i}.attn.hook_pattern``); only the blocks
    differ (the stock blocks ``TransformerModel`` builds are replaced by pre-LayerNorm blocks
    around :func:`pattern_attention`).
    """

    def __init__(self, config: SparseConfig) -> None:
        super().__init__(config)
        self.blocks = nn.ModuleList(
            Block(config, pattern_attention(config, i)) for i in range(config.n_layers)
        )


def _build(name: str, seed: int, **config: Any) -> tuple[nn.Module, WordTokenizer]:
    tokenizer = WordTokenizer()
    return seeded_reference(name, seed, tokenizer, lambda: SparseTransformer(SparseConfig(
        vocab_size=len(tokenizer), max_len=tokenizer.model_max_length, n_layers=2,
        n_heads=4, mask_seed=seed, **config,
    )))


@REFERENCE_MODELS.register("sliding-window")
def sliding_window(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """A 2-layer, 4-head bidirectional encoder with sliding-window attention (|i-j| <= 2)."""
    return _build("sliding-window", seed, pattern="sliding", window=2, causal=False)


@REFERENCE_MODELS.register("sparse")
def sparse(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """A 2-layer, 4-head BigBird encoder: blocks of 2, 1-block window, 1 global, 1 random."""
    return _build(
        "sparse", seed, pattern="bigbird", block=2, n_random=1, window_blocks=1,
        n_global_blocks=1, causal=False,
    )
