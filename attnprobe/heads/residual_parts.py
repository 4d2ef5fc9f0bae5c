"""The parts of a pre-norm model's residual stream, read off one forward, and their direct
contributions to logits: the machinery of :mod:`attnprobe.heads.direct_logits` (the
definition: [causal methods](../guide/causal-methods.md#direct-logit-attribution); Elhage et
al. 2021; TransformerLens ``decompose_resid``).

:func:`recording` hooks (for one forward; removed on exit, also on error) the input of the
first block (the embedded residual: token, position, any scaling), the input of every
attention output projection (the heads' outputs ``z``, head-major), every MLP output and the
final norm's input and output, keeping only the chosen positions. :func:`contributions`
projects each part on the logit directions of a metric's terms with the final norm's scale
frozen at the run's value; :func:`check_residual` checks the parts add up to the residual.

**Value biases** (:data:`VALUE_BIASES`): a head's output is ``z_h @ W_O[h]`` with ``z_h =
Σ_k A[q, k] (x_k @ W_V[h] + b_V[h])``; as each attention row sums to 1, ``b_V[h] @ W_O[h]`` is
the same at every position. ``"head"`` leaves it in head ``h``; ``"output"`` (TransformerLens'
``fold_value_biases``, its default) moves it into the layer's ``attn_bias`` row next to
``b_O``. The rows still sum to the same total.

**Devices and precision.** The parts stay where the model computed them (each layer's own
device); each layer's projection runs there, with the small per-term vectors (logit
directions, scales) copied to it once per batch, never the weights to one device. The
projections are computed in ``Record.dtype`` (float64; float32 on MPS) from the parts as the
model computed them (bf16 ones included), so the only rounding left is the model's own:
:func:`rounding_bound` states how far a half-precision model's own logit may lie from the sum
of the parts' exact contributions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from attnprobe.core.residence import kept
from attnprobe.core.scope import Scope
from attnprobe.errors import HookNotFiredError
from attnprobe.weights.anatomy import Anatomy, DecompositionError

__all__ = ["VALUE_BIASES", "Component", "OutputWeights", "Record", "ValueBias",
           "check_residual", "contributions", "recording", "rounding_bound", "rounding_size",
           "tolerance", "unit_roundoff"]

ValueBias = Literal["head", "output"]
VALUE_BIASES: dict[str, str] = {
    "head": "each head keeps its value bias (b_V @ W_O): what the head writes",
    "output": "value biases summed into the layer's attn_bias row (TransformerLens' default, "
              "fold_value_biases): heads read z without b_V",
}
"""Where a head's value bias is counted (module docstring)."""


def tolerance(dtype: torch.dtype) -> float:
    """The relative gap always accepted between the components' sum and the model's metric
    (of the summed magnitudes): 1e-3, far above float32 rounding; a half-precision model is
    also allowed its own rounding (:func:`rounding_bound`)."""
    return 1e-3


def unit_roundoff(dtype: torch.dtype) -> float:
    """``u``: the largest relative error of one rounding to ``dtype`` (2⁻⁸ for bf16, 2⁻¹¹ for
    float16, 2⁻²⁴ for float32)."""
    return torch.finfo(dtype).eps / 2


def residual_roundings(model: Anatomy) -> int:
    """How many roundings each residual element takes in the model's own dtype: per layer
    the attention output's (its matmul result, the parts record its input ``z``) and the two
    additions into the residual, each off by at most ``u`` times the partial sum, which is
    at most ``P = Σ_parts |part|`` elementwise."""
    return 3 * model.n_layers


def rounding_bound(model: Anatomy, dtype: torch.dtype) -> float:
    """``(3·L + 5)·u``: the model's own logit lies within this factor of :func:`rounding_size`
    of the components' sum, to first order in ``u`` (the model's dtype).

    The components are exact (float64) products of what the model computed; the model's
    logit differs from their sum by its own roundings only: ``3·L·u·P`` in the residual
    (:func:`residual_roundings`); the final norm rounds its output twice (normalised, then
    times its weight: ``2u``) and its scale, fitted on that output (least squares over the
    features), is off by at most the same ``2u``; the unembedding's output rounds once
    (``u``). Each term is bounded by ``u`` times ``Σ_j P_j |ū_j| / s`` (``ū`` the term's
    logit direction through the norm's weight, ``1/s`` the frozen scale): ``(3L + 5)·u``
    times the rounding size. 1.5 % for a 2-layer bf16 model, 0.3 for 32 layers (a bound
    on the worst case; rounding errors of a real run mostly cancel)."""
    return (residual_roundings(model) + 5) * unit_roundoff(dtype)


@dataclass(frozen=True)
class Component:
    """One row of a decomposition: ``name`` (``L1H3``, ``L0.mlp`` ...), ``kind`` (``embed``,
    ``head``, ``rest``, ``bias``, ``mlp``), its ``layer`` and ``head`` (None when none)."""

    name: str
    kind: str
    layer: int | None = None
    head: int | None = None


# ----------------------------------------------------------------------------- recording
class Record:
    """What one forward wrote into the residual stream at the kept positions, ``[rows,
    ...]`` in ``dtype``: the embedded input, per layer the heads' outputs ``z`` ``[rows,
    head · d_head]`` and the MLP output, the final norm's input and output."""

    def __init__(self, keep: torch.Tensor, dtype: torch.dtype) -> None:
        self.keep, self.dtype = keep, dtype
        self.source_dtype = dtype  # what the model computed in (its final norm's input)
        self.found: dict[str, torch.Tensor] = {}
        self.fired: dict[str, int] = {}

    def put(self, key: str, value: Any) -> None:
        if isinstance(value, (tuple, list)):
            value = value[0]
        if not isinstance(value, torch.Tensor) or value.shape[:2] != self.keep.shape:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value)
            raise DecompositionError(f"{key} gave {shape}, not [batch, seq, ...] of the batch "
                                     f"{tuple(self.keep.shape)}")
        self.fired[key] = self.fired.get(key, 0) + 1
        if key == "final_in":
            self.source_dtype = value.dtype
        self.found[key] = value.detach()[self.keep.to(value.device)].to(self.dtype)


def _first_input(args: tuple, kwargs: dict) -> Any:
    return args[0] if args else kwargs.get("hidden_states", kwargs.get("x"))


@contextmanager
def recording(model: Anatomy, keep: torch.Tensor, dtype: torch.dtype) -> Iterator[Record]:
    """Hooks that fill a :class:`Record` during one forward; removed on exit, and every
    one checked to have fired exactly once."""
    record = Record(keep, dtype)

    def before(key: str) -> Callable[..., None]:
        return lambda module, args, kwargs: record.put(key, _first_input(args, kwargs))

    def after(key: str) -> Callable[..., None]:
        return lambda module, args, output: record.put(key, output)

    def final(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        record.put("final_in", _first_input(args, kwargs))
        record.put("final_out", output)

    handles = [model.first_block.register_forward_pre_hook(before("embed"), with_kwargs=True),
               model.final_norm.register_forward_hook(final, with_kwargs=True)]
    try:
        for layer in model.layers:
            handles.append(layer.out_proj.register_forward_pre_hook(before(f"z{layer.index}"),
                                                                    with_kwargs=True))
            if layer.mlp is not None:
                handles.append(layer.mlp.register_forward_hook(after(f"mlp{layer.index}")))
        yield record
    finally:
        for handle in handles:
            handle.remove()
    missing = [k for k in _hook_keys(model) if k not in record.fired]
    if missing:
        raise HookNotFiredError(f"the hook on {missing[0]} never fired: the {model.family} "
                                "adapter's module is not on this model's forward path")
    twice = [k for k, n in record.fired.items() if n > 1]
    if twice:
        raise DecompositionError(f"{twice[0]} ran {record.fired[twice[0]]} times in one "
                                 "forward; its contribution is ambiguous")


def _hook_keys(model: Anatomy) -> list[str]:
    return ["embed", "final_in", "final_out", *(f"z{layer.index}" for layer in model.layers),
            *(f"mlp{layer.index}" for layer in model.layers if layer.mlp is not None)]


@dataclass(frozen=True)
class OutputWeights:
    """What the projection needs, read once per call: per layer ``W_O [head, d_head,
    d_model]``, ``b_O`` and ``b_V [head, d_head]`` (per query head: a key/value head's bias
    repeated for each head reading it); the unembedding ``W_U [d_model, vocab]`` and
    ``b_U``."""

    W_O: tuple[torch.Tensor, ...]
    b_O: tuple[torch.Tensor | None, ...]
    W_U: torch.Tensor
    b_U: torch.Tensor | None
    b_V: tuple[torch.Tensor | None, ...] = ()

    @classmethod
    def read(cls, model: Anatomy) -> OutputWeights:
        """One module at a time; an offloaded module's weights kept on the CPU
        (:func:`~attnprobe.core.residence.kept`) and brought to its layer's device one
        layer at a time per batch, as its forward brings them."""
        weights = [layer.weights().per_query_head() for layer in model.layers]
        W_U, b_U = model.unembedding()
        out_projs = [layer.out_proj for layer in model.layers]
        return cls(tuple(kept(w.W_O, m) for w, m in zip(weights, out_projs, strict=True)),
                   tuple(w.b_O for w in weights), kept(W_U, model.unembed), b_U,
                   tuple(w.b_V for w in weights))

    def layer_bias(self, layer: int, value_bias: str, device: torch.device,
                   dtype: torch.dtype) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(b_V [head, d_head] to take off each head's z, the layer's bias row [d_model])``
        under ``value_bias`` (module docstring), on ``device`` in ``dtype``; None where there
        is none."""
        b_O = self.b_O[layer]
        b_O = None if b_O is None else b_O.to(device, dtype)
        b_V = self.b_V[layer] if value_bias == "output" and self.b_V else None
        if b_V is None:
            return None, b_O
        b_V = b_V.to(device, dtype)
        moved = torch.einsum("hd,hdm->m", b_V, self.W_O[layer].to(device, dtype))
        return b_V, moved if b_O is None else b_O + moved

class _Near:
    """Small per-term tensors copied once to each device that asks for them."""

    def __init__(self) -> None:
        self.copies: dict[tuple[int, torch.device], torch.Tensor] = {}

    def __call__(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        key = (id(tensor), device)
        if key not in self.copies:
            self.copies[key] = tensor.to(device)
        return self.copies[key]


@dataclass(frozen=True)
class _Readout:
    """Per term: its row ``[terms]``, logit direction ``readout [terms, d]``, that direction
    through the final norm's weight (and centring) ``u [terms, d]``, the coefficient and
    ``factor = coeff / s`` ``[terms]``, on the final norm's device."""

    rows: torch.Tensor
    readout: torch.Tensor
    u: torch.Tensor
    coeff: torch.Tensor
    factor: torch.Tensor

    @classmethod
    def of(cls, model: Anatomy, weights: OutputWeights, record: Record, rows: torch.Tensor,
           tokens: torch.Tensor, coeff: torch.Tensor) -> _Readout:
        dtype, home = record.dtype, record.found["final_in"].device
        spec = model.final_spec
        # the terms' columns of W_U are picked where W_U lives: only [d, terms] moves
        readout = weights.W_U[:, tokens.to(weights.W_U.device)].T.to(home, dtype)
        u = readout * spec.weight.to(home, dtype)
        u = u - u.mean(-1, keepdim=True) if spec.centred else u  # C(c)·u == c·C(u)
        rows, coeff = rows.to(home), coeff.to(home, dtype)
        inv_s = spec.inverse_scale(record.found["final_in"], record.found["final_out"])[rows]
        return cls(rows, readout, u, coeff, coeff * inv_s)


def contributions(model: Anatomy, weights: OutputWeights, record: Record, scope: Scope,
                  rows: torch.Tensor, tokens: torch.Tensor, coeff: torch.Tensor, *,
                  value_bias: ValueBias = "head") -> list[tuple[Component, torch.Tensor]]:
    """Each component's contribution to every logit term ``[terms]`` (coefficient
    included, on the final norm's device); ``rows`` / ``tokens`` / ``coeff`` ``[terms]``;
    ``value_bias`` says where each head's value bias is counted (:data:`VALUE_BIASES`).
    Each part is projected on the device it was recorded on (module docstring)."""
    dtype, home = record.dtype, record.found["final_in"].device
    spec = model.final_spec
    terms, near = _Readout.of(model, weights, record, rows, tokens, coeff), _Near()

    def project(key: str) -> torch.Tensor:
        found = record.found[key]
        d = found.device
        return ((found[near(terms.rows, d)] * near(terms.u, d)).sum(-1)
                * near(terms.factor, d)).to(home)

    out = [(Component("embed", "embed"), project("embed"))]
    for index, (layer, W_O) in enumerate(zip(model.layers, weights.W_O, strict=True)):
        i, n = layer.index, layer.n_heads
        z = record.found[f"z{i}"]
        device = z.device  # the layer's own
        z = z[near(terms.rows, device)].view(len(terms.rows), n, -1)  # [terms, head, d_head]
        b_V, b_O = weights.layer_bias(index, value_bias, device, dtype)
        if b_V is not None:  # attention rows sum to 1: b_V is in z at every position
            z = z - b_V
        u, factor = near(terms.u, device), near(terms.factor, device)
        # W_O is cast on its layer's device one layer at a time (a float64 copy of every
        # layer's W_O would outweigh the model's own in bf16)
        through = torch.einsum("hdm,tm->thd", W_O.to(device, dtype), u)  # [terms, head, d_head]
        heads = ((z * through).sum(-1) * factor[:, None]).to(home)  # [terms, head]
        inside = [h for h in range(n) if scope.contains(i, h)]
        out += [(Component(f"L{i}H{h}", "head", i, h), heads[:, h]) for h in inside]
        if len(inside) < n:
            rest = [h for h in range(n) if h not in inside]
            out.append((Component(f"L{i}.rest", "rest", i), heads[:, rest].sum(-1)))
        if b_O is not None:
            out.append((Component(f"L{i}.attn_bias", "bias", i), ((u @ b_O) * factor).to(home)))
        if layer.mlp is not None:
            out.append((Component(f"L{i}.mlp", "mlp", i), project(f"mlp{i}")))
    if spec.bias is not None:
        out.append((Component("norm_bias", "bias"),
                    (terms.readout @ spec.bias.to(home, dtype)) * terms.coeff))
    if weights.b_U is not None:
        b_U = weights.b_U[tokens.to(weights.b_U.device)].to(home, dtype)
        out.append((Component("unembed_bias", "bias"), b_U * terms.coeff))
    return out


def rounding_size(model: Anatomy, weights: OutputWeights, record: Record,
                  magnitude: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor,
                  coeff: torch.Tensor) -> torch.Tensor:
    """``[terms]``: ``|coeff| · Σ_j P_j |ū_j| / s``, what the model's own roundings are
    relative to (:func:`rounding_bound`); ``magnitude`` is ``P`` ``[rows, d_model]`` of
    :func:`check_residual`."""
    terms = _Readout.of(model, weights, record, rows, tokens, coeff)
    P = magnitude.to(terms.u.device)[terms.rows]
    return (P * terms.u.abs()).sum(-1) * terms.factor.abs()


def check_residual(model: Anatomy, weights: OutputWeights, record: Record) -> torch.Tensor:
    """The recorded parts add up to the final norm's input (every kept row): within
    :func:`tolerance` of their largest magnitude, or within the model's own roundings
    ``3·L·u·P`` (:func:`residual_roundings`) elementwise. Returns ``P = Σ_parts |part|``
    ``[rows, d_model]`` (each layer's attention output as one part), on the final norm's
    device."""
    found = record.found
    home = found["final_in"].device
    parts = [found["embed"].to(home)]
    for layer, W_O, b_O in zip(model.layers, weights.W_O, weights.b_O, strict=True):
        z = found[f"z{layer.index}"]
        W = W_O.reshape(-1, W_O.shape[-1]).to(z.device, record.dtype)  # on the layer's device
        out = z @ W if b_O is None else z @ W + b_O.to(z.device, record.dtype)
        parts.append(out.to(home))
        if layer.mlp is not None:
            parts.append(found[f"mlp{layer.index}"].to(home))
    magnitude = torch.stack(parts).abs().sum(0)
    gaps = (sum(parts) - found["final_in"]).abs()
    scale = max(float(p.abs().max()) for p in parts) or 1.0
    allowed = torch.clamp(magnitude * residual_roundings(model)
                          * unit_roundoff(record.source_dtype),
                          min=tolerance(record.source_dtype) * scale)
    if bool((gaps > allowed).any()):
        gap = float(gaps.max())
        raise DecompositionError(f"the parts of the residual stream differ from the final "
                                 f"norm's input by {gap:.3g} ({gap / scale:.2g} of their size), "
                                 "more than the model's own rounding: this model adds something "
                                 f"the {model.family} adapter does not see (a scaled or "
                                 "re-normalised residual)")
    return magnitude
