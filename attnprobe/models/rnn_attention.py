"""Attention for RNN encoder–decoders (seed 002): Bahdanau additive, Luong dot/general/concat,
and Luong local attention (local-m, local-p).

Every module takes ONE query per call (a decoder step) and follows seed 002's code::

    forward(query [batch, d_q], keys [batch, src, d_k], key_padding_mask [batch, src])
        -> (context [batch, d_k], weights [batch, src])

The keys double as values (``context = Σ_s weights_s · keys_s``). Scores pass through
``hook_scores`` and weights through ``hook_pattern``, both ``[batch, 1, 1, src]``; a decoder
that calls the module once per step gives capture one query row per step.

Score functions (``e_s`` for source position ``s``; no ``1/sqrt(d)`` scaling, as in the seed):

- Bahdanau (additive): ``e_s = v_aᵀ tanh(W_a q + U_a k_s)`` (``W_a``, ``U_a`` with bias);
- Luong dot:     ``e_s = qᵀ k_s``                 (needs ``d_q == d_k``);
- Luong general: ``e_s = (W_a q)ᵀ k_s = qᵀ W_aᵀ k_s``  (``W_a`` without bias, as in the seed);
- Luong concat:  ``e_s = v_aᵀ tanh(W [q; k_s])``  (``W`` with bias).

Local attention (Luong et al. 2015, §3.2) restricts the softmax to the window
``[p_t − D, p_t + D]`` (clipped at the ends of the source; a window wider than an example's
source, ``2D + 1 > S``, is an InputError because it would be global attention):

- local-m: ``p_t = t`` (the decoder step, clamped to the last real source position);
- local-p: ``p_t = S · sigmoid(v_pᵀ tanh(W_p q))`` with ``S`` the real source length, and the
  weights are multiplied by ``exp(−(s − p_t)² / (2σ²))``, ``σ = D / 2``.

The paper leaves local-p's weights unnormalised after that product; here the Gaussian enters
as the log-bias ``−(s − p_t)² / (2σ²)`` before the softmax, which gives exactly the paper's
weights divided by their sum, so every row sums to 1 like every attnprobe pattern.

The RNN encoders that produce the keys (``seq2seq.py``, ``classifier.py``) read only the real
tokens of each row, wherever the padding is: :func:`real_first` and :func:`run_packed`.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnprobe.core.hook_point import HookPoint
from attnprobe.errors import InputError
from attnprobe.models.inputs import positions_from_mask
from attnprobe.models.pooling import attend_single_query, real_keys

LuongVariant = Literal["dot", "general", "concat"]
LocalMode = Literal["monotonic", "predictive"]


# ------------------------------------------------------------------ RNN encoders
def real_first(real: torch.Tensor) -> torch.Tensor:
    """``[batch, seq]`` indices that move each row's real tokens (``real`` bool) to the front,
    in their order: a stable sort of the padding flags."""
    return torch.argsort((~real).to(torch.uint8), dim=1, stable=True)


def run_packed(
    rnn: nn.RNNBase, front: torch.Tensor, real: torch.Tensor, order: torch.Tensor
) -> tuple[torch.Tensor, Any]:
    """Run ``rnn`` over the real tokens of each row only, packed.

    Args:
        front: ``[batch, seq, d]`` inputs gathered with ``order`` (real tokens first).
        real: ``[batch, seq]`` bool, True = real token.
        order: :func:`real_first` of ``real``.

    Returns:
        ``(states [batch, seq, d_out], final)``: each state back at its token's position
        (zeros at padding), and the RNN's final state (after each row's last real token).
    """
    packed = pack_padded_sequence(front, real.sum(dim=1).cpu(), batch_first=True,
                                  enforce_sorted=False)
    out, final = rnn(packed)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=front.shape[1])
    states = torch.zeros_like(out).scatter(1, order[..., None].expand_as(out), out)
    return states, final


# ------------------------------------------------------------------ score functions
class AdditiveScore(nn.Module):
    """``e_s = v_aᵀ tanh(W_a q + U_a k_s)``: query ``[batch, d_q]``, keys ``[batch, src, d_k]``
    -> ``[batch, src]``."""

    def __init__(self, d_query: int, d_key: int, d_attn: int) -> None:
        super().__init__()
        self.W_a = nn.Linear(d_query, d_attn)
        self.U_a = nn.Linear(d_key, d_attn)
        self.v_a = nn.Linear(d_attn, 1, bias=False)

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        energy = torch.tanh(self.W_a(query).unsqueeze(1) + self.U_a(keys))  # [batch, src, attn]
        return self.v_a(energy).squeeze(-1)  # [batch, src]


class DotScore(nn.Module):
    """``e_s = qᵀ k_s`` (no parameters): ``[batch, d]``, ``[batch, src, d]`` -> ``[batch, src]``."""

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return torch.bmm(keys, query.unsqueeze(2)).squeeze(2)  # [batch, src]


class GeneralScore(nn.Module):
    """``e_s = (W_a q)ᵀ k_s``: ``[batch, d_q]``, ``[batch, src, d_k]`` -> ``[batch, src]``."""

    def __init__(self, d_query: int, d_key: int) -> None:
        super().__init__()
        self.W_a = nn.Linear(d_query, d_key, bias=False)

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return torch.bmm(keys, self.W_a(query).unsqueeze(2)).squeeze(2)  # [batch, src]


class ConcatScore(nn.Module):
    """``e_s = v_aᵀ tanh(W [q; k_s])``: query ``[batch, d_q]``, keys ``[batch, src, d_k]``
    -> ``[batch, src]``."""

    def __init__(self, d_query: int, d_key: int, d_attn: int) -> None:
        super().__init__()
        self.W = nn.Linear(d_query + d_key, d_attn)
        self.v_a = nn.Linear(d_attn, 1, bias=False)

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        expanded = query.unsqueeze(1).expand(-1, keys.shape[1], -1)  # [batch, src, d_q]
        energy = torch.tanh(self.W(torch.cat([expanded, keys], dim=-1)))  # [batch, src, attn]
        return self.v_a(energy).squeeze(-1)  # [batch, src]


def luong_score(variant: str, d_query: int, d_key: int, d_attn: int) -> nn.Module:
    """The score module of a Luong variant; InputError for an unknown one or bad sizes."""
    if variant == "dot":
        if d_query != d_key:
            raise InputError(f"Luong dot needs d_query == d_key; got {d_query} and {d_key}")
        return DotScore()
    if variant == "general":
        return GeneralScore(d_query, d_key)
    if variant == "concat":
        return ConcatScore(d_query, d_key, d_attn)
    raise InputError(f"unknown Luong variant {variant!r}; choose 'dot', 'general' or 'concat'")


# ------------------------------------------------------------------ attention modules
class _SingleQueryAttention(nn.Module):
    """Shared shape checks, masking and hooks; subclasses define ``self.score``."""

    score: nn.Module

    def __init__(self) -> None:
        super().__init__()
        self.hook_scores = HookPoint()  # [batch, 1, 1, src], pre-softmax
        self.hook_pattern = HookPoint()  # [batch, 1, 1, src], post-softmax

    def _check(
        self, query: torch.Tensor, keys: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Validate shapes; return the bool ``[batch, src]`` real-key mask (or None)."""
        if query.ndim != 2 or keys.ndim != 3 or query.shape[0] != keys.shape[0] \
                or keys.shape[1] == 0:
            raise InputError(
                "query must be [batch, d_q] and keys [batch, src, d_k] with src >= 1; got "
                f"{tuple(query.shape)} and {tuple(keys.shape)}"
            )
        return real_keys(key_padding_mask, keys.shape[0], keys.shape[1], keys.device)

    def forward(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(context [batch, d_k], weights [batch, src])`` of one query per example."""
        allowed = self._check(query, keys, key_padding_mask)
        try:
            scores = self.score(query, keys)  # [batch, src]
        except RuntimeError as err:  # a feature size that does not fit the projections
            raise InputError(
                f"{type(self).__name__}: query {tuple(query.shape)} / keys {tuple(keys.shape)} "
                f"do not fit its projections ({str(err).splitlines()[0]})"
            ) from None
        return attend_single_query(scores, keys, allowed, self.hook_scores, self.hook_pattern)


class BahdanauAttention(_SingleQueryAttention):
    """Additive attention ``e_s = v_aᵀ tanh(W_a q + U_a k_s)`` (Bahdanau et al. 2014).

    Args:
        d_query: query (decoder state) size; d_key: key (encoder state) size;
        d_attn: hidden size of the score MLP (default ``d_key``).
    """

    def __init__(self, d_query: int, d_key: int, d_attn: int | None = None) -> None:
        super().__init__()
        self.score = AdditiveScore(d_query, d_key, d_attn or d_key)


class LuongAttention(_SingleQueryAttention):
    """Global multiplicative attention (Luong et al. 2015): ``variant`` = dot | general | concat.

    Args:
        d_query, d_key: query and key sizes (equal for ``dot``);
        d_attn: hidden size of the ``concat`` score MLP (default ``d_key``).
    """

    def __init__(
        self, d_query: int, d_key: int, variant: LuongVariant = "general",
        d_attn: int | None = None,
    ) -> None:
        super().__init__()
        self.variant = variant
        self.score = luong_score(variant, d_query, d_key, d_attn or d_key)


class LocalAttention(_SingleQueryAttention):
    """Luong local attention over the window ``[p_t − D, p_t + D]``.

    Args:
        d_query, d_key: query and key sizes.
        window: ``D`` (half-width). ``monotonic`` needs ``D >= 0``, ``predictive`` ``D >= 1``
            (so the window always holds a source position).
        mode: ``"monotonic"`` (local-m, ``p_t = t``) or ``"predictive"`` (local-p).
        variant: the score inside the window (Luong dot | general | concat).

    Call:
        ``forward(query, keys, key_padding_mask=None, *, step=None)``; ``step`` (int or
        LongTensor ``[batch]``) is the decoder step ``t``, required by local-m, unused by local-p.
    """

    def __init__(
        self, d_query: int, d_key: int, window: int, mode: LocalMode = "predictive",
        variant: LuongVariant = "general", d_attn: int | None = None,
    ) -> None:
        super().__init__()
        if mode not in ("monotonic", "predictive"):
            raise InputError(f"mode must be 'monotonic' or 'predictive'; got {mode!r}")
        if window < (1 if mode == "predictive" else 0):
            raise InputError(f"window D must be >= {1 if mode == 'predictive' else 0} for "
                             f"{mode} local attention; got {window}")
        self.window = window
        self.mode = mode
        self.sigma = window / 2
        self.score = luong_score(variant, d_query, d_key, d_attn or d_key)
        if mode == "predictive":
            self.W_p = nn.Linear(d_query, d_attn or d_key, bias=False)
            self.v_p = nn.Linear(d_attn or d_key, 1, bias=False)

    def forward(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        *,
        step: int | torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(context [batch, d_k], weights [batch, src])``; zero weight outside the window."""
        allowed = self._check(query, keys, key_padding_mask)
        batch, src, _ = keys.shape
        real = allowed if allowed is not None else keys.new_ones(batch, src, dtype=torch.bool)
        length = real.sum(dim=1)  # [batch] real source length S
        if bool((length < 2 * self.window + 1).any()):
            raise InputError(
                f"local attention window 2D+1 = {2 * self.window + 1} is larger than the "
                f"source ({int(length.min())} real tokens); use a smaller window"
            )
        # real-token position of every key (padding anywhere is skipped): [batch, src]
        position = positions_from_mask(real).to(query.dtype)
        p = self.center(query, length, step)  # [batch]
        distance = position - p[:, None]  # [batch, src]
        allowed = real & (distance.abs() <= self.window)  # [batch, src]
        bias = None
        if self.mode == "predictive":
            bias = -(distance**2) / (2 * self.sigma**2)  # log of the Gaussian weight
        scores = self.score(query, keys)  # [batch, src]
        return attend_single_query(
            scores, keys, allowed, self.hook_scores, self.hook_pattern, bias=bias
        )

    def center(
        self, query: torch.Tensor, length: torch.Tensor, step: int | torch.Tensor | None
    ) -> torch.Tensor:
        """Window centre ``p_t`` ``[batch]`` (in real-token positions, float)."""
        if self.mode == "predictive":
            gate = torch.sigmoid(self.v_p(torch.tanh(self.W_p(query)))).squeeze(-1)  # [batch]
            return length.to(query.dtype) * gate
        if step is None:
            raise InputError("monotonic local attention needs step=t (the decoder step)")
        t = torch.as_tensor(step, device=query.device).expand(query.shape[0])  # [batch]
        if bool((t < 0).any()):
            raise InputError(f"step must be >= 0; got {t.tolist()}")
        return torch.minimum(t, length - 1).to(query.dtype)  # p_t = t, clamped to the source
