"""Per-head attention weights and norms read off a model's modules, in one convention.

**Row vectors.** Every matrix here acts on row vectors, as ``x @ W`` (TransformerLens'
convention): a head's query is ``q = x @ W_Q[h] + b_Q[h]``, its output written into the residual
stream ``z @ W_O[h]``. ``nn.Linear`` keeps ``weight`` as ``[out, in]`` (``x @ weight.T``),
transformers' ``Conv1D`` (GPT-2) as ``[in, out]``; :func:`row_matrix` turns both into
``[in, out]``.

**Norms** are read by what they do, not by their class: :func:`read_norm` runs a copy of the
module on probe vectors and fits ``y = C(x) / s(x) ⊙ weight + bias``, with ``C`` the centring of
LayerNorm (or none: RMSNorm) and ``s`` the root mean square of ``C(x)``. That covers
``nn.LayerNorm``, every ``...RMSNorm``, parameter-free norms (OLMo) and Gemma's ``1 + weight``
alike; a module that fits neither form is an error.

**Folding** (:meth:`HeadWeights.folded`), as TransformerLens' ``fold_ln`` does: the
pre-attention norm's weight multiplies the rows of ``W_Q``, ``W_K``, ``W_V`` (its bias goes into
their biases), and for a LayerNorm the reading weights are centred over ``d_model`` (the
centring the norm applies), so ``q = x̂ @ W_Q' + b_Q'`` with ``x̂ = C(x) / s(x)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from attnprobe.core.residence import dequantized, detached_copy, loaded
from attnprobe.errors import InputError

__all__ = ["HeadWeights", "NormSpec", "read_norm", "row_matrix", "split_in", "split_out"]

_PROBE_ROWS = 64
_FIT_TOLERANCE = 1e-4  # relative; the probe ignores eps (≈ 1e-5 / 9 of the variance)


def row_matrix(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(W [in, out], b [out] or None)`` with ``module(x) = x @ W + b``, detached, read from
    wherever the module keeps them (loaded by its offload hook for the read only, a quantized
    weight dequantized: :mod:`attnprobe.core.residence`).

    Serves ``nn.Linear`` (``weight [out, in]``) and transformers' ``Conv1D`` (``weight [in,
    out]``, ``nf`` output features)."""
    with loaded(module):
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor):
            weight = dequantized(weight, module)
        bias = getattr(module, "bias", None)
        bias = bias.detach() if isinstance(bias, torch.Tensor) else None
    return _as_rows(module, weight, bias)


def _as_rows(module: nn.Module, weight: object, bias: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2:
        raise InputError(f"{type(module).__name__} is not a linear projection (no 2-D weight)")
    if isinstance(module, nn.Linear):
        matrix = weight.T
    elif type(module).__name__ == "Conv1D" and weight.shape[1] == getattr(module, "nf", -1):
        matrix = weight
    else:
        raise InputError(f"{type(module).__name__} is neither nn.Linear nor a Conv1D; its "
                         "weights cannot be read as a projection")
    return matrix.detach(), bias


def split_in(matrix: torch.Tensor, n: int) -> torch.Tensor:
    """A reading projection's ``[d_model, n · d_head]`` as ``[n, d_model, d_head]`` (heads are
    head-major blocks of the output features, as every model here lays them out)."""
    d_in, width = matrix.shape
    return matrix.reshape(d_in, n, width // n).permute(1, 0, 2)


def split_out(matrix: torch.Tensor, n: int) -> torch.Tensor:
    """An output projection's ``[n · d_head, d_model]`` as ``[n, d_head, d_model]``."""
    width, d_out = matrix.shape
    return matrix.reshape(n, width // n, d_out)


@dataclass(frozen=True)
class NormSpec:
    """How a norm acts: ``y = C(x) / s(x) ⊙ weight + bias`` over the last axis.

    ``centred``: ``C`` subtracts the mean (LayerNorm) or is the identity (RMSNorm); ``s`` is
    the root mean square of ``C(x)`` plus the module's eps. ``weight`` / ``bias``
    ``[d_model]`` float64 on the CPU (``bias`` None when the norm adds none).
    """

    centred: bool
    weight: torch.Tensor
    bias: torch.Tensor | None

    @property
    def kind(self) -> str:
        return "layernorm" if self.centred else "rmsnorm"

    def centre(self, x: torch.Tensor) -> torch.Tensor:
        """``C(x)`` over the last axis."""
        return x - x.mean(-1, keepdim=True) if self.centred else x

    def inverse_scale(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``1 / s`` the norm computed for each row, read off its input ``x`` and output ``y``
        ``[rows, d_model]`` (least squares over the features, so the module's own eps and
        arithmetic are what count): ``[rows]``."""
        weight = self.weight.to(x.device, x.dtype)
        a = self.centre(x) * weight  # [rows, d_model]
        target = y if self.bias is None else y - self.bias.to(y.device, y.dtype)
        return (target * a).sum(-1) / (a * a).sum(-1).clamp_min(torch.finfo(a.dtype).tiny)


def _normalised(x: torch.Tensor, centred: bool) -> torch.Tensor:
    c = x - x.mean(-1, keepdim=True) if centred else x
    return c / c.pow(2).mean(-1, keepdim=True).sqrt()


def read_norm(module: nn.Module, d_model: int, where: str = "") -> NormSpec:
    """The :class:`NormSpec` of ``module``, fitted on probe rows (module docstring).

    Raises:
        InputError: the module is not ``normalise(x) ⊙ weight + bias`` for either centring.
    """
    with loaded(module):
        probe = detached_copy(module).to(device="cpu", dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    x = 3 * torch.randn(_PROBE_ROWS, d_model, generator=generator) \
        + 2 * torch.randn(_PROBE_ROWS, 1, generator=generator)  # rows with a mean: C matters
    with torch.no_grad():
        y = probe(x)
    if isinstance(y, tuple):
        y = y[0]
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        raise InputError(f"{where or type(module).__name__} does not act like a norm "
                         "([rows, d_model] in, the same out)")
    x, y = x.double(), y.double()
    scale = y.abs().max().clamp_min(1e-12)
    for centred in (False, True):
        xhat = _normalised(x, centred)  # [rows, d_model]
        dx = xhat - xhat.mean(0)
        weight = (dx * (y - y.mean(0))).sum(0) / dx.pow(2).sum(0).clamp_min(1e-30)
        bias = y.mean(0) - weight * xhat.mean(0)
        if ((xhat * weight + bias - y).abs().max() / scale) <= _FIT_TOLERANCE:
            keep = bias.abs().max() > _FIT_TOLERANCE * scale
            return NormSpec(centred, weight, bias if keep else None)
    raise InputError(f"{where or type(module).__name__} ({type(module).__name__}) is neither "
                     "a LayerNorm nor an RMSNorm (normalise(x) · weight + bias); its scale "
                     "cannot be frozen")


@dataclass(frozen=True)
class HeadWeights:
    """One attention layer's weights per head (module docstring: row vectors).

    Shapes: ``W_Q [head, d_model, d_head]``; ``W_K``, ``W_V [kv_head, d_model, d_head]``;
    ``W_O [head, d_head, d_model]``; ``b_Q [head, d_head]``; ``b_K``, ``b_V [kv_head,
    d_head]``; ``b_O [d_model]`` (each bias None when the model has none). With grouped-query
    (GQA) or multi-query (MQA) attention query head ``h`` reads key/value head
    ``h // (n_heads // n_kv_heads)`` (:meth:`kv_head`).
    """

    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    W_O: torch.Tensor
    b_Q: torch.Tensor | None = None
    b_K: torch.Tensor | None = None
    b_V: torch.Tensor | None = None
    b_O: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n, d_model, _ = self.W_Q.shape
        kv = self.W_K.shape[0]
        if self.W_V.shape[0] != kv or n % kv or self.W_O.shape[0] != n \
                or self.W_O.shape[1] != self.W_V.shape[2] or self.W_O.shape[2] != d_model:
            raise InputError(f"inconsistent head weights: W_Q {tuple(self.W_Q.shape)}, W_K "
                             f"{tuple(self.W_K.shape)}, W_V {tuple(self.W_V.shape)}, W_O "
                             f"{tuple(self.W_O.shape)}")

    @property
    def n_heads(self) -> int:
        return int(self.W_Q.shape[0])

    @property
    def n_kv_heads(self) -> int:
        return int(self.W_K.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.W_Q.shape[1])

    def kv_head(self, head: int) -> int:
        """The key/value head query head ``head`` reads."""
        return head // (self.n_heads // self.n_kv_heads)

    def per_query_head(self) -> HeadWeights:
        """The same weights with ``W_K``, ``W_V`` (and their biases) repeated for every query
        head, so every tensor is indexed by the query head."""
        if self.n_kv_heads == self.n_heads:
            return self
        index = torch.tensor([self.kv_head(h) for h in range(self.n_heads)])

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.index_select(0, index.to(t.device))
        return replace(self, W_K=pick(self.W_K), W_V=pick(self.W_V), b_K=pick(self.b_K),
                       b_V=pick(self.b_V))

    def to(self, dtype: torch.dtype, device: torch.device | str = "cpu") -> HeadWeights:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.detach().to(device=device, dtype=dtype)
        return HeadWeights(*(move(getattr(self, name)) for name in
                             ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")))

    def folded(self, norm: NormSpec, *, centre_output: bool = False) -> HeadWeights:
        """The weights with the pre-attention ``norm`` folded in (module docstring), so they
        read the normalised residual ``x̂ = C(x) / s(x)``; ``centre_output`` also centres
        ``W_O`` / ``b_O`` over ``d_model`` (TransformerLens' ``center_writing_weights``, for
        models whose every later reader is a LayerNorm)."""
        w = norm.weight.to(self.W_Q.device, self.W_Q.dtype)
        b = None if norm.bias is None else norm.bias.to(self.W_Q.device, self.W_Q.dtype)

        def read(W: torch.Tensor, bias: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
            if b is not None:  # [n, d_head]: the norm's bias through W
                through = torch.einsum("m,nmd->nd", b, W)
                bias = through if bias is None else bias + through
            W = W * w[None, :, None]
            if norm.centred:
                W = W - W.mean(1, keepdim=True)
            return W, bias

        W_Q, b_Q = read(self.W_Q, self.b_Q)
        W_K, b_K = read(self.W_K, self.b_K)
        W_V, b_V = read(self.W_V, self.b_V)
        W_O, b_O = self.W_O, self.b_O
        if centre_output:
            W_O = W_O - W_O.mean(-1, keepdim=True)
            b_O = None if b_O is None else b_O - b_O.mean()
        return HeadWeights(W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O)
