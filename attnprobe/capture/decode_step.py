"""KV-cache decoding steps without the model's eager attention function.

A step of ``model.generate`` feeds one query row against the cache with no mask (SDPA's
``is_causal`` skip: the row may see every cached key). Its weights are then
``softmax(q kᵀ · scaling)``, and the model's eager function spends most of its time around
that: it copies the cache's keys and values once per query head (grouped-query attention),
applies dropout and casts. :func:`lean_step` computes the same weights and output with the
query heads grouped over their key/value head instead (no copy), which is what makes a
captured ``generate`` cost little more than a plain one on small models.

It is only a stand-in for the eager function, so it is checked against it: the first step of
every site in a capture runs both (:func:`same_as_eager`); a site whose eager function computes
something else (soft-capping, sink logits, another scaling ...) keeps the eager function for the
rest of the capture. Steps with a mask, extra attention arguments, dropout, edits or position
biases never take this path.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["lean_step", "plain_step_kwargs", "same_as_eager"]

# keyword arguments an attention function may get that do not change what SDPA computes
_PLAIN_KWARGS = frozenset({"scaling", "dropout", "is_causal", "position_ids", "cache_position",
                           "use_cache", "output_attentions", "sliding_window"})


def plain_step_kwargs(kwargs: dict[str, Any]) -> bool:
    """Whether the attention call's keyword arguments leave a plain softmax(q kᵀ · scaling)."""
    return all(name in _PLAIN_KWARGS for name in kwargs) and not kwargs.get("dropout") \
        and kwargs.get("sliding_window") is None


def lean_step(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              scaling: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output [batch, q, head, d_v], weights [batch, head, q, key])`` of unmasked
    attention, as the eager functions compute them (the product in the model's dtype, the
    softmax in float32); ``query`` ``[batch, head, q, d]``, ``key`` ``[batch, kv_head, key, d]``,
    ``value`` ``[batch, kv_head, key, d_v]`` (``d_v`` may differ from ``d``, as in DeepSeek's
    latent attention).
    """
    batch, n_heads, q_len, d = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    scale = d ** -0.5 if scaling is None else scaling
    grouped = query.reshape(batch, kv_heads, (n_heads // kv_heads) * q_len, d)
    scores = torch.matmul(grouped, key.transpose(2, 3)) * scale
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    output = torch.matmul(weights, value).view(batch, n_heads, q_len, value.shape[-1])
    return output.transpose(1, 2).contiguous(), weights.view(batch, n_heads, q_len, k_len)


def same_as_eager(lean: tuple[torch.Tensor, torch.Tensor],
                  eager: tuple[torch.Tensor, torch.Tensor | None]) -> bool:
    """Whether :func:`lean_step`'s output and weights equal the eager function's (to the
    rounding of their dtype)."""
    (out, weights), (eager_out, eager_weights) = lean, eager
    if eager_weights is None or weights.shape != eager_weights.shape \
            or out.shape != eager_out.shape:
        return False
    eps = torch.finfo(weights.dtype).eps
    return bool(torch.allclose(weights, eager_weights, rtol=8 * eps, atol=8 * eps)
                and torch.allclose(out, eager_out.to(out.dtype), rtol=8 * eps,
                                   atol=8 * eps * float(eager_out.abs().max().clamp(min=1))))
