"""Linear attention with the ELU+1 feature map (Katharopoulos et al. 2020, "Transformers are
RNNs").

With ``φ(x) = elu(x) + 1`` (positive everywhere), softmax attention is replaced by

    out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ  /  φ(q_i)ᵀ Σ_j φ(k_j)

where ``j`` runs over all keys (bidirectional) or ``j <= i`` (causal, via prefix sums). The
sums are computed once, so time and memory are linear in the length and the ``[query, key]``
matrix is never formed (:func:`linear_attention`).

For analysis the implicit weights ``a_ij = φ(q_i)·φ(k_j) / Σ_j' φ(q_i)·φ(k_j')`` are made
explicit on demand (:func:`explicit_linear_attention`): ``hook_scores`` receives the
unnormalised kernel ``φ(q)·φ(k)``, ``hook_pattern`` the normalised weights, and the output is
``weights @ v``, so an edit through either hook changes the output. :class:`LinearAttention`
takes this quadratic path when ``explicit=True`` or when a hook is registered on one of its
hook points (as ``attnprobe.capture`` does); otherwise it takes the linear path.

Padding follows ``MultiHeadAttention``: padding keys get zero weight and a padding query
attends only to itself (its output is its own value; meaningless, but never NaN).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnprobe.core.hook_point import HookPoint
from attnprobe.errors import InputError
from attnprobe.models.attention import MultiHeadAttention
from attnprobe.models.inputs import check_key_padding_mask
from attnprobe.models.tokenizer import WordTokenizer
from attnprobe.models.transformer import Block, TransformerConfig, TransformerModel
from attnprobe.models.zoo import REFERENCE_MODELS, seeded_reference


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``φ(x) = elu(x) + 1``, elementwise and positive."""
    return F.elu(x) + 1


def _check(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, real: torch.Tensor | None
) -> torch.Tensor | None:
    """Validate ``[batch, head, seq, d]`` inputs; return the bool ``[batch, seq]`` mask."""
    if query.ndim != 4 or query.shape != key.shape or value.shape[:-1] != key.shape[:-1]:
        raise InputError(
            "linear attention needs query/key [batch, head, seq, d] of one shape and value "
            f"[batch, head, seq, dv]; got {tuple(query.shape)}, {tuple(key.shape)}, "
            f"{tuple(value.shape)}"
        )
    batch, _, n, _ = query.shape
    return check_key_padding_mask(real, batch, n, query.device)  # [batch, seq] or None


def linear_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    *,
    causal: bool = False,
) -> torch.Tensor:
    """The linear path: O(n) time and memory, no ``[query, key]`` matrix.

    Args:
        query, key: ``[batch, head, seq, d]`` (self-attention: one length).
        value: ``[batch, head, seq, dv]``.
        key_padding_mask: ``[batch, seq]`` bool or 0/1, 1 = real token; None = all real.
        causal: query ``i`` uses keys ``j <= i`` only (prefix sums).

    Returns:
        ``[batch, head, seq, dv]``.
    """
    real = _check(query, key, value, key_padding_mask)
    phi_q, phi_k = elu_feature_map(query), elu_feature_map(key)  # [batch, head, seq, d]
    if real is not None:
        phi_k = phi_k * real[:, None, :, None]  # padding keys contribute nothing
    if causal:
        kv = torch.einsum("bhkd,bhke->bhkde", phi_k, value).cumsum(dim=2)  # [b, h, seq, d, dv]
        num = torch.einsum("bhqd,bhqde->bhqe", phi_q, kv)  # [batch, head, query, dv]
        den = (phi_q * phi_k.cumsum(dim=2)).sum(-1)  # [batch, head, query]
    else:
        kv = torch.einsum("bhkd,bhke->bhde", phi_k, value)  # [batch, head, d, dv]
        num = phi_q @ kv  # [batch, head, query, dv]
        den = (phi_q * phi_k.sum(dim=2, keepdim=True)).sum(-1)  # [batch, head, query]
    out = num / den.clamp_min(torch.finfo(den.dtype).tiny)[..., None]
    if real is not None:  # a padding query attends only to itself
        out = torch.where(real[:, None, :, None], out, value)
    return out  # [batch, head, query, dv]


def explicit_linear_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    hook_scores: HookPoint,
    hook_pattern: HookPoint,
    *,
    causal: bool = False,
) -> torch.Tensor:
    """The same attention with its weights materialised and sent through the hooks.

    ``hook_scores`` gets the kernel ``φ(q) @ φ(k)ᵀ`` (before masking), ``hook_pattern`` the
    weights ``a_ij`` (rows sum to 1, zero on forbidden keys); both ``[batch, head, q, k]``.
    Arguments and result as in :func:`linear_attention`.
    """
    real = _check(query, key, value, key_padding_mask)
    n = query.shape[2]
    kernel = elu_feature_map(query) @ elu_feature_map(key).transpose(-2, -1)  # [b, h, q, k]
    kernel = hook_scores(kernel)

    allowed = torch.ones(n, n, dtype=torch.bool, device=query.device)  # [query, key]
    if causal:
        allowed = allowed.tril()
    if real is not None:
        eye = torch.eye(n, dtype=torch.bool, device=query.device)
        # real queries: real keys; a padding query: itself only
        allowed = torch.where(real[:, :, None], allowed & real[:, None, :], eye)  # [b, q, k]
        allowed = allowed[:, None]  # [batch, 1, query, key]
    weights = kernel.masked_fill(~allowed, 0.0)
    total = weights.sum(dim=-1, keepdim=True)  # [batch, head, query, 1]
    pattern = weights / total.clamp_min(torch.finfo(total.dtype).tiny)  # [b, h, q, k]
    pattern = hook_pattern(pattern)
    return pattern @ value  # [batch, head, query, dv]


def _hooked(point: nn.Module) -> bool:
    return bool(point._forward_hooks or point._forward_pre_hooks)


class LinearAttention(MultiHeadAttention):
    """Multi-head linear self-attention (ELU+1 feature map), bidirectional or causal.

    The projections and hook points of :class:`MultiHeadAttention` (no grouped-query
    variant); the softmax is replaced by the kernel.

    Args:
        d_model: model width; must be divisible by ``n_heads``.
        n_heads: number of heads.
        causal: each query uses only keys at or before it.
        bias: whether the four projections have a bias.
        explicit: always materialise the weights (otherwise only when a hook point is hooked).

    Shapes:
        x ``[batch, seq, d_model]`` -> ``[batch, seq, d_model]``; hook points see
        ``[batch, head, query, key]``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        causal: bool = False,
        bias: bool = True,
        explicit: bool = False,
    ) -> None:
        super().__init__(d_model, n_heads, bias=bias)
        self.causal = causal
        self.explicit = explicit
        # hook_scores: [batch, head, query, key], kernel φ(q)·φ(k); hook_pattern: the weights

    @property
    def materialises(self) -> bool:
        """Whether the next forward takes the explicit (quadratic) path."""
        return self.explicit or _hooked(self.hook_pattern) or _hooked(self.hook_scores)

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        *,
        causal: bool = False,
    ) -> torch.Tensor:
        """x ``[batch, seq, d_model]``, key_padding_mask ``[batch, seq]`` (1 = real) -> like x.

        ``causal=True`` makes this call causal also when the layer is not (as for the other
        attention layers; a causal layer always is).
        """
        causal = self.causal or causal
        q, k, v = self.project(x)  # [batch, head, seq, d_head] each
        if self.materialises:
            z = explicit_linear_attention(
                q, k, v, key_padding_mask, self.hook_scores, self.hook_pattern, causal=causal
            )
        else:
            z = linear_attention(q, k, v, key_padding_mask, causal=causal)
        return self.merge(z)  # [batch, seq, d_model]


class LinearTransformer(TransformerModel):
    """:class:`TransformerModel` with linear attention in every block.

    Same inputs, outputs and hook paths (``blocks.{i}.attn.hook_pattern``); the stock blocks
    ``TransformerModel`` builds are replaced by pre-LayerNorm blocks around
    :class:`LinearAttention`.
    """

    def __init__(self, config: TransformerConfig) -> None:
        if config.n_kv_heads not in (None, config.n_heads):
            raise InputError("LinearTransformer has no grouped-query variant; "
                             f"got n_kv_heads={config.n_kv_heads}, n_heads={config.n_heads}")
        super().__init__(config)
        self.blocks = nn.ModuleList(
            Block(config, LinearAttention(config.d_model, config.n_heads, causal=config.causal,
                                          bias=config.bias))
            for _ in range(config.n_layers)
        )


@REFERENCE_MODELS.register("linear")
def linear(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """A 2-layer, 4-head causal decoder with linear (ELU+1 kernel) attention."""
    tokenizer = WordTokenizer()
    return seeded_reference("linear", seed, tokenizer, lambda: LinearTransformer(TransformerConfig(
        vocab_size=len(tokenizer), max_len=tokenizer.model_max_length, n_layers=2, n_heads=4,
        causal=True,
    )))
