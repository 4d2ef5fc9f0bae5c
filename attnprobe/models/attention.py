"""Scaled dot-product and multi-head attention, written out explicitly so hooks can see them.

The attention weights are always materialised (never ``F.scaled_dot_product_attention``), and
every module passes them through two hook points:

- ``hook_scores``: pre-softmax, pre-mask scores ``q @ kᵀ / sqrt(d)`` (+ an optional bias, e.g.
  ALiBi's) ``[batch, head, query, key]``
- ``hook_pattern``: post-softmax weights                             ``[batch, head, query, key]``

Multi-head modules also pass their queries, keys and values (after rotary embeddings, before
grouped heads are repeated) and their per-head outputs through ``hook_q`` ``[batch, head,
query, d]``, ``hook_k`` / ``hook_v`` ``[batch, kv_head, key, d]`` and ``hook_z`` ``[batch, head,
query, d]`` (TransformerLens' names), the seams of activation patching.

A forward hook on either can read the tensor or return a replacement (the edit seam).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnprobe.core.hook_point import HookPoint
from attnprobe.errors import InputError
from attnprobe.models.inputs import check_key_padding_mask


def causal_mask(n_query: int, n_key: int, device: torch.device | None = None) -> torch.Tensor:
    """Bool ``[query, key]`` mask, True where query ``i`` may attend key ``j <= i``.

    Aligned top-left, like ``F.scaled_dot_product_attention(is_causal=True)``.
    """
    return torch.ones(n_query, n_key, dtype=torch.bool, device=device).tril()


def scaled_dot_product(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    hook_scores: HookPoint,
    hook_pattern: HookPoint,
    *,
    causal: bool = False,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(mask(q @ kᵀ / sqrt(d) [+ bias])) @ v, with both intermediate tensors sent
    through hooks.

    Args:
        query: ``[batch, head, query, d]``.
        key: ``[batch, head, key, d]``.
        value: ``[batch, head, key, dv]``.
        mask: bool, broadcastable to ``[batch, head, query, key]``; True = may attend. Or None.
        hook_scores: receives the scaled (and biased) scores before masking.
        hook_pattern: receives the post-softmax weights.
        causal: also forbid keys after the query (top-left aligned).
        bias: float, broadcastable to ``[batch, head, query, key]``, added to the scaled
            scores before ``hook_scores`` (ALiBi's distance penalty), or None.

    Returns:
        ``[batch, head, query, dv]``.

    Raises:
        InputError: bad shapes, a non-bool mask, or a query row with no allowed key.

    Example:
        >>> draw = torch.Generator().manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 5, 8, generator=draw).unbind(0)  # [batch, head, seq, d]
        >>> out = scaled_dot_product(q, k, v, None, HookPoint(), HookPoint(), causal=True)
        >>> out.shape                                   # [batch, head, query, dv]
        torch.Size([1, 2, 5, 8])
        >>> sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> torch.allclose(out, sdpa, atol=1e-6)
        True
    """
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        raise InputError(
            "query, key and value must be 4-d [batch, head, seq, dim]; got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise InputError(
            "query/key feature sizes or key/value lengths differ: query "
            f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    n_query, n_key = query.shape[-2], key.shape[-2]
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])  # [batch, head, q, k]
    if bias is not None:
        scores = scores + bias
    scores = hook_scores(scores)

    allowed = _allowed(mask, scores.shape, n_query, n_key, causal, scores.device)
    if allowed is not None:
        if not bool(allowed.any(dim=-1).all()):
            raise InputError(
                "fully masked query row: some query may attend no key; check the attention "
                "mask (a real token needs at least one real key)"
            )
        scores = scores.masked_fill(~allowed, float("-inf"))

    pattern = torch.softmax(scores, dim=-1)  # [batch, head, query, key]
    pattern = hook_pattern(pattern)
    return pattern @ value  # [batch, head, query, dv]


def _allowed(
    mask: torch.Tensor | None,
    shape: torch.Size,
    n_query: int,
    n_key: int,
    causal: bool,
    device: torch.device,
) -> torch.Tensor | None:
    """Combine the user mask and the causal mask into one bool ``[batch, head, q, k]``."""
    allowed = None
    if mask is not None:
        if mask.dtype != torch.bool:
            raise InputError(
                f"attention mask must be a bool tensor (True = attend); got {mask.dtype}"
            )
        try:
            allowed = torch.broadcast_to(mask.to(device), shape)
        except RuntimeError:
            raise InputError(
                f"attention mask of shape {tuple(mask.shape)} does not broadcast to "
                f"[batch, head, query, key] = {tuple(shape)}"
            ) from None
    if causal:
        tri = causal_mask(n_query, n_key, device)  # [query, key]
        allowed = tri.expand(shape) if allowed is None else allowed & tri
    return allowed


class ScaledDotProductAttention(nn.Module):
    """Parameter-free attention over given q/k/v: ``softmax(q @ kᵀ / sqrt(d)) @ v``.

    Shapes:
        query ``[batch, head, query, d]``, key ``[batch, head, key, d]``,
        value ``[batch, head, key, dv]`` -> ``[batch, head, query, dv]``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.hook_scores = HookPoint()  # [batch, head, query, key], pre-softmax
        self.hook_pattern = HookPoint()  # [batch, head, query, key], post-softmax

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        causal: bool = False,
    ) -> torch.Tensor:
        return scaled_dot_product(
            query, key, value, mask, self.hook_scores, self.hook_pattern, causal=causal
        )


class MultiHeadAttention(nn.Module):
    """Multi-head (optionally grouped-query, optionally cross-) attention.

    With ``n_kv_heads < n_heads`` (GQA), each key/value head serves ``n_heads // n_kv_heads``
    consecutive query heads: query head ``h`` uses key/value head ``h // group``.

    Args:
        d_model: model width; must be divisible by ``n_heads``.
        n_heads: number of query heads.
        n_kv_heads: number of key/value heads (default ``n_heads``); must divide ``n_heads``.
        bias: whether the four projections have a bias.

    Shapes:
        x ``[batch, query, d_model]``, context ``[batch, key, d_model]``
        -> ``[batch, query, d_model]``.
        Hook points ``hook_scores`` and ``hook_pattern`` see ``[batch, head, query, key]``.
    """

    def __init__(
        self, d_model: int, n_heads: int, n_kv_heads: int | None = None, *, bias: bool = True
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads < 1 or d_model % n_heads:
            raise InputError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise InputError(f"n_heads={n_heads} must be divisible by n_kv_heads={n_kv_heads}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=bias)
        self.out_proj = nn.Linear(n_heads * self.d_head, d_model, bias=bias)
        self.hook_scores = HookPoint()  # [batch, head, query, key], pre-softmax
        self.hook_pattern = HookPoint()  # [batch, head, query, key], post-softmax
        self.hook_q = HookPoint()  # [batch, head, query, d_head]
        self.hook_k = HookPoint()  # [batch, kv_head, key, d_head]
        self.hook_v = HookPoint()  # [batch, kv_head, key, d_head]
        self.hook_z = HookPoint()  # [batch, head, query, d_head], per-head outputs

    def hooked(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values through ``hook_q`` / ``hook_k`` / ``hook_v``."""
        return self.hook_q(q), self.hook_k(k), self.hook_v(v)

    def _split(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """``[batch, seq, n * d_head]`` -> ``[batch, n, seq, d_head]``."""
        batch, seq, _ = x.shape
        return x.view(batch, seq, n, self.d_head).transpose(1, 2)

    def project(
        self, x: torch.Tensor, context: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Check the inputs and project them to heads: queries from ``x`` ``[batch, query,
        d_model]``, keys and values from ``context`` ``[batch, key, d_model]`` (or ``x``).

        Returns:
            ``q [batch, head, query, d_head]``, ``k, v [batch, kv_head, key, d_head]``.
        """
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise InputError(f"x must be [batch, seq, {self.d_model}]; got {tuple(x.shape)}")
        source = x if context is None else context
        if source.ndim != 3 or source.shape[0] != x.shape[0] or source.shape[-1] != self.d_model:
            raise InputError(
                f"context must be [batch={x.shape[0]}, seq, {self.d_model}]; "
                f"got {tuple(source.shape)}"
            )
        q = self._split(self.q_proj(x), self.n_heads)  # [batch, head, query, d_head]
        k = self._split(self.k_proj(source), self.n_kv_heads)  # [batch, kv_head, key, d_head]
        v = self._split(self.v_proj(source), self.n_kv_heads)  # [batch, kv_head, key, d_head]
        return q, k, v

    def expand_kv(self, kv: torch.Tensor) -> torch.Tensor:
        """GQA: ``[batch, kv_head, key, d]`` -> ``[batch, head, key, d]``, each key/value head
        repeated for the ``n_heads // n_kv_heads`` query heads it serves."""
        group = self.n_heads // self.n_kv_heads
        return kv.repeat_interleave(group, dim=1) if group > 1 else kv

    def merge(self, z: torch.Tensor) -> torch.Tensor:
        """Heads back to the model width: ``[batch, head, query, d_head]`` -> ``out_proj`` of
        ``[batch, query, head * d_head]`` -> ``[batch, query, d_model]``."""
        z = self.hook_z(z)
        batch, _, n_query, _ = z.shape
        z = z.transpose(1, 2).reshape(batch, n_query, self.n_heads * self.d_head)
        return self.out_proj(z)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        causal: bool = False,
    ) -> torch.Tensor:
        """Attend from ``x`` to itself, or to ``context`` (cross-attention) when given.

        Args:
            x: ``[batch, query, d_model]``.
            context: ``[batch, key, d_model]`` or None (self-attention, key = query).
            key_padding_mask: ``[batch, key]`` bool or 0/1, 1 = real token; None = all real.
                In self-attention a padding query attends only to itself (see ``build_mask``).
            attn_mask: extra bool mask broadcastable to ``[batch, head, query, key]``.
            causal: forbid keys after the query.

        Returns:
            ``[batch, query, d_model]``.
        """
        # q [batch, head, query, d_head]; k, v [batch, kv_head, key, d_head]
        q, k, v = self.hooked(*self.project(x, context))
        k, v = self.expand_kv(k), self.expand_kv(v)  # [batch, head, key, d_head]
        mask = self.build_mask(
            attn_mask,
            key_padding_mask,
            (q.shape[0], q.shape[2], k.shape[2]),  # (batch, query, key)
            causal=causal,
            self_attention=context is None,
            device=x.device,
        )  # bool, broadcastable to [batch, head, query, key], or None
        z = scaled_dot_product(
            q, k, v, mask, self.hook_scores, self.hook_pattern
        )  # [batch, head, query, d_head]
        return self.merge(z)  # [batch, query, d_model]

    @staticmethod
    def build_mask(
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        sizes: tuple[int, int, int],
        *,
        causal: bool,
        self_attention: bool,
        device: torch.device,
    ) -> torch.Tensor | None:
        """One bool mask (True = may attend) from the optional parts; None if there are none.

        In self-attention a padding query may attend only to itself, so its row is never empty
        (its output is meaningless and never reaches a real token). Real queries never see
        padding keys.

        Args:
            attn_mask: bool, broadcastable to ``[batch, head, query, key]``, or None.
            key_padding_mask: ``[batch, key]`` bool or 0/1, 1 = real token, or None.
            sizes: ``(batch, query, key)``.

        Returns:
            bool, broadcastable to ``[batch, head, query, key]``, or None.
        """
        batch, n_query, n_key = sizes
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            raise InputError(
                f"attn_mask must be a bool tensor (True = attend); got {attn_mask.dtype}"
            )
        mask = attn_mask
        if causal:
            tri = causal_mask(n_query, n_key, device)  # [query, key]
            mask = tri if mask is None else mask & tri
        real = check_key_padding_mask(key_padding_mask, batch, n_key, device)  # [batch, key]
        if real is None:
            return mask
        keys = real[:, None, None, :]  # [batch, 1, 1, key]
        mask = keys if mask is None else mask & keys
        if self_attention:
            eye = torch.eye(n_query, n_key, dtype=torch.bool, device=device)  # [query, key]
            mask = mask | (eye & ~real[:, None, :, None])  # padding query -> itself
        return mask
