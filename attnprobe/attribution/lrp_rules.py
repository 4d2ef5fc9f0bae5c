"""AttnLRP propagation rules (Achtibat et al. 2024, ICML) as autograd functions.

Every function here computes the ordinary forward value and replaces the backward pass by one
LRP rule written in **gradient × input form** (as the LXT library does): the backward carries
a *modified gradient* ``g`` such that the relevance of any tensor ``t`` on the path is
``R_t = t ⊙ g_t``.
Starting the backward at the explained logit ``y`` with gradient 1 gives it relevance ``y``; the
relevance of the input embeddings is then ``x ⊙ x.grad``. Operations left to plain autograd (a
residual addition, a scale by a constant) are linear without bias, for which the gradient is the
LRP-0 rule and conserves relevance exactly.

Rules (``R'`` is the relevance of the outputs, ``R`` that of the inputs, ``ε' = ε·sign(z)`` with
``sign(0) = +1``):

- :func:`lrp_linear` — ε-rule: ``R_i = Σ_j x_i W_ji / (z_j + ε'_j) · R'_j`` with ``z = Wx + b``.
  ``Σ R = Σ_j (z_j − b_j) / (z_j + ε'_j) · R'_j``: the bias and ε absorb the rest.
- :func:`lrp_activation` — identity rule for an elementwise nonlinearity ``y = f(x)``:
  ``R_i = R'_i · x_i / (x_i + ε'_i)``, i.e. ``R = R'`` up to ε.
- :func:`lrp_softmax` — the paper's softmax rule (Prop. 3.1, a first-order Taylor expansion at
  the input, which is exactly the softmax's own Jacobian): ``R_i = x_i (R'_i − s_i Σ_j R'_j)``.
  The bias of that expansion absorbs ``Σ_j (1 − x_j + Σ_i s_i x_i) R'_j``, so
  ``Σ R + that bias = Σ R'``.
- :func:`lrp_matmul` / :func:`lrp_mul` — uniform rule for a bilinear product (attention scores
  ``QKᵀ``, attention × values, the gated MLP's ``act(gate) ⊙ up``): half the relevance to each
  factor, each by the ε-rule; with ``ε = 0`` each factor receives exactly ``½ Σ R'``.
- :func:`lrp_layer_norm` / :func:`lrp_rms_norm` — identity rule on the normalisation: the
  standard deviation (root mean square) is held constant, so the layer is linear in its input.
  RMS norm conserves exactly (``R = R'`` elementwise); layer norm's mean subtraction is linear
  (LRP-0) and its shift ``β`` absorbs ``Σ_k β_k g_k``.

Masked attention scores (``−inf`` or a large negative number) get softmax weight 0 and therefore
a zero modified gradient: they never receive relevance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from attnprobe.errors import InputError

DEFAULT_EPSILON = 1e-6
"""The ε of the linear layers' ε-rule (LXT's default for float32 models)."""

__all__ = [
    "DEFAULT_EPSILON",
    "half_gradient",
    "lrp_activation",
    "lrp_layer_norm",
    "lrp_linear",
    "lrp_matmul",
    "lrp_mul",
    "lrp_rms_norm",
    "lrp_softmax",
    "relevance",
    "stabilize",
]


def stabilize(z: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``z + ε·sign(z)`` with ``sign(0) = +1``, the ε-rule's denominator (any shape)."""
    return z + epsilon * torch.where(z >= 0, 1.0, -1.0).to(z.dtype)


def relevance(tensor: torch.Tensor, grad: torch.Tensor | None) -> torch.Tensor:
    """Relevance of ``tensor`` from its modified gradient: ``tensor ⊙ grad`` (same shape).

    Raises:
        InputError: when ``grad`` is None (no backward reached the tensor).
    """
    if grad is None:
        raise InputError("no relevance reached this tensor: run backward from the explained logit "
                         "first, with the tensor requiring grad")
    return tensor * grad


def _check_epsilon(epsilon: float) -> float:
    if not epsilon >= 0:
        raise InputError(f"epsilon must be a non-negative number, got {epsilon!r}")
    return float(epsilon)


def _epsilon_scaled(grad: torch.Tensor, out: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``g ⊙ z / (z + ε')``: the output relevance ``z ⊙ g`` divided by the stabilised ``z``."""
    if epsilon == 0:
        return grad
    return grad * out / stabilize(out, epsilon)


class _LinearEpsilon(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                epsilon: float) -> torch.Tensor:
        out = F.linear(x, weight, bias)
        ctx.save_for_backward(weight, out)
        ctx.epsilon = epsilon
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        weight, out = ctx.saved_tensors
        return _epsilon_scaled(grad, out, ctx.epsilon) @ weight, None, None, None


def lrp_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               epsilon: float = DEFAULT_EPSILON) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` whose backward is the LRP ε-rule.

    Args:
        x: ``(..., in)`` input.
        weight: ``(out, in)``; it receives no gradient (relevance flows to ``x`` only).
        bias: ``(out,)`` or None.
        epsilon: the ε-rule's stabiliser (≥ 0; 0 is LRP-0, the plain gradient).

    Returns:
        ``(..., out)``, the layer's output.
    """
    return _LinearEpsilon.apply(x, weight, bias, _check_epsilon(epsilon))


class _IdentityRule(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor],
                epsilon: float) -> torch.Tensor:
        out = fn(x)
        ctx.save_for_backward(x, out)
        ctx.epsilon = epsilon
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, out = ctx.saved_tensors
        # R_in = x ⊙ g_in must equal R_out = y ⊙ g, hence g_in = g ⊙ y / x (stabilised)
        return grad * out / stabilize(x, ctx.epsilon), None, None


def lrp_activation(x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor],
                   epsilon: float = DEFAULT_EPSILON) -> torch.Tensor:
    """``fn(x)`` for an elementwise nonlinearity (GELU, SiLU, ReLU, tanh), identity rule backward.

    Args:
        x: any shape.
        fn: the elementwise function; must keep the shape.
        epsilon: stabiliser of the division by ``x`` (> 0 where ``x`` can be 0).

    Returns:
        ``fn(x)``, same shape as ``x``; each element passes its relevance on unchanged
        (``R_i = R'_i · x_i / (x_i + ε'_i)``).
    """
    return _IdentityRule.apply(x, fn, _check_epsilon(epsilon))


class _SoftmaxRule(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int) -> torch.Tensor:
        out = torch.softmax(x, dim=dim)
        ctx.save_for_backward(out)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (out,) = ctx.saved_tensors
        # g_in = R_in / x = R' − s Σ R' with R' = s ⊙ g; never touches x, so −inf masks stay finite
        out_relevance = out * grad
        return out_relevance - out * out_relevance.sum(ctx.dim, keepdim=True), None


def lrp_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``softmax(x, dim)`` with the AttnLRP softmax rule ``R_i = x_i (R'_i − s_i Σ_j R'_j)``.

    Args:
        x: the scores, any shape (``(batch, heads, query, key)`` for attention); masked entries
            may be ``−inf``.
        dim: the normalised dimension.

    Returns:
        The softmax, same shape as ``x``.
    """
    return _SoftmaxRule.apply(x, dim)


def _sum_to(grad: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Undo broadcasting: sum ``grad`` down to ``shape`` (a factor that was broadcast)."""
    return grad if tuple(grad.shape) == tuple(shape) else grad.sum_to_size(tuple(shape))


class _UniformProduct(torch.autograd.Function):
    """``a @ b`` (``matmul``) or ``a ⊙ b`` whose backward gives each factor half of the
    relevance (the uniform rule)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, epsilon: float,
                matmul: bool) -> torch.Tensor:
        out = a @ b if matmul else a * b
        ctx.save_for_backward(a, b, out)
        ctx.epsilon, ctx.matmul = epsilon, matmul
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        a, b, out = ctx.saved_tensors
        half = _epsilon_scaled(grad, out, ctx.epsilon) / 2
        if ctx.matmul:
            to_a, to_b = half @ b.transpose(-2, -1), a.transpose(-2, -1) @ half
        else:
            to_a, to_b = half * b, half * a
        return _sum_to(to_a, a.shape), _sum_to(to_b, b.shape), None, None


def lrp_matmul(a: torch.Tensor, b: torch.Tensor, epsilon: float = 0.0) -> torch.Tensor:
    """``a @ b`` of two activations (``Q Kᵀ``, ``A V``) with the uniform rule backward.

    Args:
        a: ``(..., n, k)``.
        b: ``(..., k, m)``; batch dimensions broadcast as in ``torch.matmul``.
        epsilon: ε of the ε-rule each half goes through (0: exact halves).

    Returns:
        ``(..., n, m)``; ``a`` and ``b`` each receive half of its relevance.
    """
    if a.dim() < 2 or b.dim() < 2:
        raise InputError(f"lrp_matmul needs two matrices (or batches of them), got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    return _UniformProduct.apply(a, b, _check_epsilon(epsilon), True)


def lrp_mul(a: torch.Tensor, b: torch.Tensor, epsilon: float = 0.0) -> torch.Tensor:
    """Elementwise ``a ⊙ b`` of two activations (gated MLP) with the uniform rule backward.

    Args:
        a: any shape (e.g. ``act(gate(x))``, ``(..., hidden)``).
        b: broadcastable with ``a`` (e.g. ``up(x)``).
        epsilon: ε of the ε-rule each half goes through (0: exact halves).

    Returns:
        ``a ⊙ b``; ``a`` and ``b`` each receive half of its relevance.
    """
    return _UniformProduct.apply(a, b, _check_epsilon(epsilon), False)


def _held_std_norm(x: torch.Tensor, dims: tuple[int, ...], eps: float, centre: bool
                   ) -> torch.Tensor:
    """``(x − mean) / std`` (``centre``) or ``x / rms`` with the divisor detached."""
    centred = x - x.mean(dims, keepdim=True) if centre else x
    spread = centred.pow(2).mean(dims, keepdim=True)
    return centred * torch.rsqrt(spread + eps).detach()


def lrp_layer_norm(x: torch.Tensor, normalized_shape: Sequence[int],
                   weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                   eps: float = 1e-5) -> torch.Tensor:
    """``F.layer_norm`` with the standard deviation held constant (identity rule on it).

    Args:
        x: ``(..., *normalized_shape)``.
        normalized_shape: the trailing dimensions normalised over.
        weight: ``normalized_shape`` scale ``γ`` or None.
        bias: ``normalized_shape`` shift ``β`` or None (it absorbs ``Σ β ⊙ g`` of relevance).
        eps: the variance stabiliser of the model's layer norm.

    Returns:
        Same values as ``F.layer_norm(x, normalized_shape, weight, bias, eps)``.
    """
    dims = tuple(range(-len(normalized_shape), 0))
    out = _held_std_norm(x, dims, eps, centre=True)
    out = out * weight if weight is not None else out
    return out + bias if bias is not None else out


def lrp_rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6
                 ) -> torch.Tensor:
    """RMS norm ``γ ⊙ x / sqrt(mean(x²) + eps)`` (LLaMA) with the root mean square held constant.

    Args:
        x: ``(..., hidden)``.
        weight: ``(hidden,)`` scale ``γ`` or None (pass ``1 + γ`` for Gemma-style norms).
        eps: the model's stabiliser.

    Returns:
        ``(..., hidden)``; each element keeps its relevance exactly (``R = R'``).
    """
    out = _held_std_norm(x, (-1,), eps, centre=False)
    return out * weight if weight is not None else out


class _HalfGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad / 2


def half_gradient(x: torch.Tensor) -> torch.Tensor:
    """Identity whose backward halves the gradient: one factor's share of the uniform rule.

    Marking *both* factors of a product ``a ⊙ b`` computed by ordinary code (a model's gated MLP,
    ``act(gate) * up``) makes the product's plain gradient the uniform rule with ``ε = 0``
    (each factor receives exactly ``½ R'``), without replacing the code that multiplies.

    Args:
        x: any shape, a factor used only in that product.

    Returns:
        ``x`` (a view); its gradient is half the incoming one.
    """
    return _HalfGradient.apply(x)
