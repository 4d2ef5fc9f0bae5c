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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from attnprobe.core.scope import Scope
from attnprobe.errors import HookNotFiredError
from attnprobe.weights.anatomy import Anatomy, DecompositionError

__all__ = ["VALUE_BIASES", "Component", "OutputWeights", "Record", "ValueBias",
           "check_residual", "contributions", "recording", "tolerance"]

ValueBias = Literal["head", "output"]
VALUE_BIASES: dict[str, str] = {
    "head": "each head keeps its value bias (b_V @ W_O): what the head writes",
    "output": "value biases summed into the layer's attn_bias row (TransformerLens' default, "
              "fold_value_biases): heads read z without b_V",
}
"""Where a head's value bias is counted (module docstring)."""


def tolerance(dtype: torch.dtype) -> float:
    """The largest relative gap accepted between the components' sum and the model's metric:
    1e-3 for float32/64, four units of the last place for half precision (whose own additions
    round the residual)."""
    return max(1e-3, 4 * torch.finfo(dtype).eps)


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
        weights = [layer.weights().per_query_head() for layer in model.layers]
        W_U, b_U = model.unembedding()
        return cls(tuple(w.W_O for w in weights), tuple(w.b_O for w in weights), W_U, b_U,
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

def contributions(model: Anatomy, weights: OutputWeights, record: Record, scope: Scope,
                  rows: torch.Tensor, tokens: torch.Tensor, coeff: torch.Tensor, *,
                  value_bias: ValueBias = "head") -> list[tuple[Component, torch.Tensor]]:
    """Each component's contribution to every logit term ``[terms]`` (coefficient
    included); ``rows`` / ``tokens`` / ``coeff`` ``[terms]``; ``value_bias`` says where each
    head's value bias is counted (:data:`VALUE_BIASES`)."""
    dtype, device = record.dtype, record.found["final_in"].device
    spec = model.final_spec
    readout = weights.W_U[:, tokens.to(weights.W_U.device)].T.to(device, dtype)  # [terms, d]
    u = readout * spec.weight.to(device, dtype)
    u = u - u.mean(-1, keepdim=True) if spec.centred else u  # C(c)·u == c·C(u)
    coeff = coeff.to(device, dtype)
    inv_s = spec.inverse_scale(record.found["final_in"], record.found["final_out"])[rows]
    factor = coeff * inv_s  # [terms]

    def project(key: str) -> torch.Tensor:
        return (record.found[key][rows] * u).sum(-1) * factor

    out = [(Component("embed", "embed"), project("embed"))]
    for index, (layer, W_O) in enumerate(zip(model.layers, weights.W_O, strict=True)):
        i, n = layer.index, layer.n_heads
        z = record.found[f"z{i}"][rows].view(len(rows), n, -1)  # [terms, head, d_head]
        b_V, b_O = weights.layer_bias(index, value_bias, device, dtype)
        if b_V is not None:  # attention rows sum to 1: b_V is in z at every position
            z = z - b_V
        through = torch.einsum("hdm,tm->thd", W_O.to(device, dtype), u)  # [terms, head, d_head]
        heads = (z * through).sum(-1) * factor[:, None]  # [terms, head]
        inside = [h for h in range(n) if scope.contains(i, h)]
        out += [(Component(f"L{i}H{h}", "head", i, h), heads[:, h]) for h in inside]
        if len(inside) < n:
            rest = [h for h in range(n) if h not in inside]
            out.append((Component(f"L{i}.rest", "rest", i), heads[:, rest].sum(-1)))
        if b_O is not None:
            out.append((Component(f"L{i}.attn_bias", "bias", i), (u @ b_O) * factor))
        if layer.mlp is not None:
            out.append((Component(f"L{i}.mlp", "mlp", i), project(f"mlp{i}")))
    if spec.bias is not None:
        out.append((Component("norm_bias", "bias"),
                    (readout @ spec.bias.to(device, dtype)) * coeff))
    if weights.b_U is not None:
        b_U = weights.b_U.to(device, dtype)[tokens.to(device)]
        out.append((Component("unembed_bias", "bias"), b_U * coeff))
    return out


def check_residual(model: Anatomy, weights: OutputWeights, record: Record) -> None:
    """The recorded parts add up to the final norm's input (every kept row)."""
    found = record.found
    parts = [found["embed"]]
    for layer, W_O, b_O in zip(model.layers, weights.W_O, weights.b_O, strict=True):
        W = W_O.reshape(-1, W_O.shape[-1]).to(found["embed"].device, record.dtype)
        parts.append(found[f"z{layer.index}"] @ W)
        if b_O is not None:
            parts.append(b_O.to(W.device, record.dtype).expand_as(parts[0]))
        if layer.mlp is not None:
            parts.append(found[f"mlp{layer.index}"])
    gap = float((sum(parts) - found["final_in"]).abs().max())
    scale = max(float(p.abs().max()) for p in parts) or 1.0
    if gap / scale > tolerance(record.source_dtype):
        raise DecompositionError(f"the parts of the residual stream differ from the final "
                                 f"norm's input by {gap:.3g} ({gap / scale:.2g} of their size): "
                                 f"this model adds something the {model.family} adapter does "
                                 "not see (a scaled or re-normalised residual)")
