"""Entropy and the distances between distributions, one definition each.

Conventions: distributions lie on the last axis; natural logarithms (nats), so a uniform row
over ``n`` keys has entropy ``ln n`` and the Jensen–Shannon divergence is at most ``ln 2``;
``0 · ln 0 = 0``. Every module of attnprobe that needs one of these quantities calls this
module, so the same quantity has the same value everywhere.
"""

from __future__ import annotations

import torch

from attnprobe.errors import InputError

__all__ = ["entropy", "jsd", "row_sum_tolerance", "tvd"]


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy ``-Σ_j p_j ln p_j`` over the last axis, in ``p``'s dtype: ``[...]``."""
    return -torch.special.xlogy(p, p).sum(-1)


def _pair(p: torch.Tensor, q: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(p, torch.Tensor) or not isinstance(q, torch.Tensor):
        raise InputError(f"{what} needs two tensors")
    if p.ndim == 0 or q.ndim == 0:
        raise InputError(f"{what} needs vectors on the last axis; got scalars")
    try:
        torch.broadcast_shapes(p.shape, q.shape)
    except RuntimeError:
        raise InputError(f"{what}: shapes differ, {tuple(p.shape)} vs {tuple(q.shape)}") from None
    if p.shape[-1] != q.shape[-1]:
        raise InputError(f"{what}: shapes differ, {tuple(p.shape)} vs {tuple(q.shape)}")
    return p, q


def _out_dtype(p: torch.Tensor) -> torch.dtype:
    return p.dtype if p.is_floating_point() else torch.get_default_dtype()


def tvd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total variation distance ``½ Σ_i |p_i − q_i|`` over the last axis (broadcasts):
    ``[...]``, summed in float64 and returned in the inputs' dtype.

    Example:
        >>> p = torch.tensor([[1.0, 0.0], [0.5, 0.5]])    # [row, key]
        >>> tvd(p, torch.tensor([0.0, 1.0]))              # disjoint rows; half the mass moved
        tensor([1.0000, 0.5000])
    """
    p, q = _pair(p, q, "tvd")
    return (0.5 * (p.double() - q.double()).abs().sum(-1)).to(_out_dtype(p))


def jsd(p: torch.Tensor, q: torch.Tensor, *, eps: float = 0.0) -> torch.Tensor:
    """Jensen–Shannon divergence ``½ KL(p‖m) + ½ KL(q‖m)``, ``m = (p+q)/2``, over the last axis
    (broadcasts): ``[...]``; 0 for equal inputs, ``ln 2`` for disjoint supports.

    With ``eps = 0`` (default) it is exact (``0 · ln 0 = 0``), summed in float64 and returned
    in the inputs' dtype. ``eps > 0`` adds ``eps`` inside the logarithms and keeps the inputs'
    dtype, so the gradient stays finite where both rows are 0 (Jain & Wallace's adversarial
    search optimises through it with ``eps = 1e-10``).

    Example:
        >>> p = torch.tensor([[1.0, 0.0], [0.5, 0.5]])    # [row, key]
        >>> jsd(p, torch.tensor([0.0, 1.0]))[0] / np.log(2)   # disjoint supports: ln 2
        tensor(1.)
        >>> jsd(p, p)                                     # equal rows
        tensor([0., 0.])
    """
    p, q = _pair(p, q, "jsd")
    if eps > 0:
        m = 0.5 * (p + q)
        log_m = torch.log(m + eps)
        kl_p = (p * (torch.log(p + eps) - log_m)).sum(-1)
        kl_q = (q * (torch.log(q + eps) - log_m)).sum(-1)
        return 0.5 * (kl_p + kl_q)
    a, b = p.double(), q.double()
    m = 0.5 * (a + b)
    kl_a = (torch.special.xlogy(a, a) - torch.special.xlogy(a, m)).sum(-1)
    kl_b = (torch.special.xlogy(b, b) - torch.special.xlogy(b, m)).sum(-1)
    return (0.5 * (kl_a + kl_b)).clamp(min=0.0).to(_out_dtype(p))


def row_sum_tolerance(dtype: torch.dtype | str) -> float:
    """How far from 1 a row of softmax weights computed in ``dtype`` may sum: 1e-3, or four
    units of the dtype's rounding (bfloat16 rows are off by up to a few 1e-3)."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), torch.float32)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        dtype = torch.float32
    return max(1e-3, 4 * torch.finfo(dtype).eps)
