"""Attention interventions: small frozen parameter objects with one verb, and where they apply.

Every intervention is a frozen dataclass registered in :data:`INTERVENTIONS` with a ``name``,
what it ``acts_on`` (``"pattern"``: post-softmax weights ``[batch, head, query, key]``;
``"output"``: per-head outputs ``[batch, head, query, d_head]`` before the output projection;
:func:`edit_part` is the capture part that applies it there) and one verb::

    intervention(tensor, heads, generator=None, *, layer=None) -> tensor

It changes only the head indices ``heads`` (``None`` = every head) and returns a new tensor;
the other heads are returned bit-identical and the input is never mutated.

**Valid keys.** The verb sees weights, not masks. Masked keys (padding, the causal future,
sliding windows) get *exactly* zero weight from the softmax of transformers' eager attention
and of attnprobe's reference models, so the valid keys of a row are the keys with weight > 0
in that row's original pattern. Every pattern intervention keeps weight 0 on the other keys,
and the rows it redistributes sum to 1 over the valid keys. Caveat: a real key whose weight
underflowed to exactly 0 (very peaked rows, mostly in float16/bfloat16) counts as masked.

Randomness comes only from the ``generator`` (a CPU generator by default, so results do not
depend on the device); every (batch, head, query) row gets its own draws, so ``n`` copies of one
example in a batch receive ``n`` independent perturbations in one forward, and drawing for a
batch of ``n`` consumes the generator exactly like ``n`` forwards of batch 1 in sequence.

:class:`Scope` (in :mod:`attnprobe.core.scope`) says which layers and heads an
intervention touches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, Protocol

import torch

from attnprobe.capture import Edit, EditOutput, Part
from attnprobe.capture.rewrites import EditFn
from attnprobe.core.registry import Registry, one_of
from attnprobe.errors import InputError

ActsOn = Literal["pattern", "output"]  # what an intervention edits

__all__ = [
    "INTERVENTIONS",
    "Dirichlet",
    "Erase",
    "Intervention",
    "Mean",
    "Permute",
    "Uniform",
    "Zero",
    "describe",
    "edit_part",
    "make_intervention",
]


# ----------------------------------------------------------------------------- protocol
class Intervention(Protocol):
    """A parameter object with one verb (see the module docstring)."""

    name: ClassVar[str]
    acts_on: ClassVar[ActsOn]

    def __call__(self, tensor: torch.Tensor, heads: Sequence[int] | None,
                 generator: torch.Generator | None = None, *,
                 layer: int | None = None) -> torch.Tensor: ...

    def check(self, layers: Sequence[int], n_heads: int) -> None: ...


INTERVENTIONS: Registry[type] = Registry("intervention")


def make_intervention(name: str, **params: Any) -> Intervention:
    """The intervention registered as ``name`` with ``params``; InputError on bad input.

    Example:
        >>> make_intervention("erase", k=2)
        Erase(k=2, keys=None)
    """
    if name not in INTERVENTIONS:
        raise InputError(one_of("intervention", name, INTERVENTIONS.names()))
    cls = INTERVENTIONS.get(name)
    accepted = [f.name for f in fields(cls)]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise InputError(f"intervention {name!r} takes {', '.join(accepted) or 'no parameters'}; "
                         f"got {', '.join(unknown)}")
    return cls(**params)


# the capture part that runs an intervention's verb where it acts
EDIT_PARTS: dict[str, type[Edit] | type[EditOutput]] = {"pattern": Edit, "output": EditOutput}


def edit_part(intervention: Intervention, fn: EditFn) -> Part:
    """The capture part that applies ``fn(layer, tensor) -> tensor`` (a wrapper of
    ``intervention``'s verb) to what the intervention acts on: ``Edit(fn)`` for weights,
    ``EditOutput(fn)`` for per-head outputs."""
    return EDIT_PARTS[intervention.acts_on](fn)


def describe(intervention: Intervention) -> dict[str, Any]:
    """JSON-friendly parameters (tensors as their shape), e.g. for tidy parameter columns.

    Example:
        >>> describe(make_intervention("dirichlet", alpha=0.5))
        {'alpha': 0.5}
        >>> means = {0: torch.zeros(12, 32), 1: torch.zeros(12, 32)}   # [head, d_head]
        >>> describe(make_intervention("mean", means=means))        # a mapping by its size
        {'means': '2 layers'}
    """
    out: dict[str, Any] = {}
    for f in fields(intervention):  # type: ignore[arg-type]
        value = getattr(intervention, f.name)
        if isinstance(value, torch.Tensor):
            value = f"tensor{list(value.shape)}"
        elif isinstance(value, Mapping):
            value = f"{len(value)} layers"
        out[f.name] = value
    return out


class _Base:
    """Shared plumbing: head selection and putting edited heads back."""

    acts_on: ClassVar[ActsOn] = "pattern"

    def check(self, layers: Sequence[int], n_heads: int) -> None:
        """Raise InputError when the intervention cannot act on these layers (before a forward)."""

    def __call__(self, tensor: torch.Tensor, heads: Sequence[int] | None,
                 generator: torch.Generator | None = None, *,
                 layer: int | None = None) -> torch.Tensor:
        if tensor.ndim != 4:
            raise InputError(f"{self.name} expects [batch, head, query, key|d_head]; "  # type: ignore[attr-defined]
                             f"got shape {tuple(tensor.shape)}")
        index = _head_index(tensor.shape[1], heads, tensor.device)
        sub = tensor.index_select(1, index)
        new = self._edit(sub, index, generator, layer)
        return tensor.index_copy(1, index, new.to(tensor.dtype))

    def _edit(self, sub: torch.Tensor, index: torch.Tensor, generator: torch.Generator | None,
              layer: int | None) -> torch.Tensor:
        raise NotImplementedError


def _head_index(n_heads: int, heads: Sequence[int] | None, device: torch.device) -> torch.Tensor:
    if heads is None:
        return torch.arange(n_heads, device=device)
    bad = [h for h in heads if not 0 <= h < n_heads]
    if bad or not len(heads):
        raise InputError(f"heads {list(heads)} out of range: the layer has {n_heads} heads "
                         f"(0..{n_heads - 1})")
    return torch.tensor(sorted(set(heads)), dtype=torch.long, device=device)


def _draw(kind: str, shape: torch.Size, generator: torch.Generator | None,
          device: torch.device, **kw: Any) -> torch.Tensor:
    """Random numbers on the generator's device (then moved), so draws do not depend on where
    the model runs; without a generator, the global RNG on ``device``."""
    where = generator.device if generator is not None else device
    if kind == "rand":
        out = torch.rand(shape, generator=generator, device=where, dtype=kw["dtype"])
    else:  # gamma(concentration)
        conc = torch.full(shape, kw["concentration"], dtype=kw["dtype"], device=where)
        out = torch._standard_gamma(conc, generator=generator)
    return out.to(device)


def _renormalised(weights: torch.Tensor) -> torch.Tensor:
    """Rows divided by their sum; rows with nothing left stay all zero."""
    total = weights.sum(-1, keepdim=True)
    return torch.where(total > 0, weights / total.clamp(min=torch.finfo(weights.dtype).tiny), 0.0)


def _positive(name: str, value: Any, *, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0 \
            or value != value or value == float("inf"):
        what = "a positive integer" if integer else "a positive finite number"
        raise InputError(f"{name} must be {what}; got {value!r}")


# ----------------------------------------------------------------------------- interventions
@INTERVENTIONS.register("permute")
@dataclass(frozen=True)
class Permute(_Base):
    """Jain & Wallace's permutation: each row's weights shuffled over its valid keys.

    Every (batch, head, query) row gets its own random permutation; the multiset of weights
    (hence the row sum) is unchanged. A uniform row is left bit-identical.
    """

    name: ClassVar[str] = "permute"

    def _edit(self, sub, index, generator, layer):
        valid = sub > 0
        u = _draw("rand", sub.shape, generator, sub.device, dtype=torch.float32)
        # valid keys in random order, then the others; and valid keys in index order, then others
        shuffled = torch.where(valid, u, 2.0).argsort(-1)
        ordered = (~valid).to(torch.int8).argsort(dim=-1, stable=True)
        return torch.zeros_like(sub).scatter(-1, ordered, sub.gather(-1, shuffled))


@INTERVENTIONS.register("uniform")
@dataclass(frozen=True)
class Uniform(_Base):
    """Kovaleva's head disabling / Wiegreffe & Pinter's baseline: ``1/n`` on the ``n`` valid
    keys of each row (``1/(i+1)`` in row ``i`` of a causal model)."""

    name: ClassVar[str] = "uniform"

    def _edit(self, sub, index, generator, layer):
        valid = sub > 0
        return valid.to(sub.dtype) / valid.sum(-1, keepdim=True).clamp(min=1).to(sub.dtype)


@INTERVENTIONS.register("zero")
@dataclass(frozen=True)
class Zero(_Base):
    """Michel et al.'s head ablation: all weights 0, so the head's output is exactly 0
    (its rows sum to 0, not 1)."""

    name: ClassVar[str] = "zero"

    def _edit(self, sub, index, generator, layer):
        return torch.zeros_like(sub)


@INTERVENTIONS.register("erase")
@dataclass(frozen=True, eq=False)
class Erase(_Base):
    """Serrano & Smith's erasure: the ``k`` largest weights of each row set to 0 and the row
    renormalised over the remaining valid keys.

    ``keys`` instead erases given key positions (e.g. ranked by gradient): a 1-D integer tensor
    of positions erased in every row, or a bool tensor broadcastable to
    ``[batch, head, query, key]`` (head axis: 1 or the layer's head count; True = erase).
    A row left with no valid key (e.g. row 0 of a causal model, ``k >= n``) becomes all zero:
    the head contributes nothing at that query.
    """

    k: int = 1
    keys: torch.Tensor | None = None
    name: ClassVar[str] = "erase"

    def __post_init__(self) -> None:
        _positive("erase k", self.k, integer=True)
        if self.keys is not None:
            if not isinstance(self.keys, torch.Tensor):
                raise InputError(f"erase keys must be a tensor; got {type(self.keys).__name__}")
            keys = self.keys
            if keys.dtype != torch.bool and (keys.ndim != 1 or keys.is_floating_point()
                                             or keys.is_complex() or bool((keys < 0).any())):
                raise InputError("erase keys must be a 1-D tensor of non-negative key positions "
                                 "or a bool mask broadcastable to [batch, head, query, key]")

    def _mask(self, sub: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        if self.keys is None:
            k = min(self.k, sub.shape[-1])
            top = sub.topk(k, dim=-1).indices
            return torch.zeros_like(sub, dtype=torch.bool).scatter(-1, top, True)
        keys = self.keys.to(sub.device)
        if keys.dtype != torch.bool:
            if keys.numel() and int(keys.max()) >= sub.shape[-1]:
                raise InputError(f"erase keys {keys.tolist()} out of range: rows have "
                                 f"{sub.shape[-1]} keys")
            return torch.zeros(sub.shape[-1], dtype=torch.bool, device=sub.device) \
                .index_fill(0, keys, True).expand_as(sub)
        while keys.ndim < 4:
            keys = keys[None]
        if keys.shape[1] != 1:
            if keys.shape[1] <= int(index.max()):
                raise InputError(f"erase keys mask has {keys.shape[1]} heads; give 1 or all "
                                 "of the layer's heads")
            keys = keys.index_select(1, index)
        try:
            return keys.expand_as(sub)
        except RuntimeError:
            raise InputError(f"erase keys mask of shape {tuple(self.keys.shape)} does not "
                             f"broadcast to [batch, head, query, key] {tuple(sub.shape)}") from None

    def _edit(self, sub, index, generator, layer):
        return _renormalised(sub.masked_fill(self._mask(sub, index), 0.0))


@INTERVENTIONS.register("dirichlet")
@dataclass(frozen=True)
class Dirichlet(_Base):
    """A random re-draw of each row from Dirichlet(``alpha``) over its valid keys
    (Wiegreffe & Pinter's random baseline; ``alpha=1`` is uniform on the simplex).

    Drawn in log space, ``log G(α+1) + log(U)/α`` (exact for every α > 0, and stable for small
    α where a direct Gamma(α) draw underflows to 0).
    """

    alpha: float = 1.0
    name: ClassVar[str] = "dirichlet"

    def __post_init__(self) -> None:
        _positive("dirichlet alpha", self.alpha)

    def _edit(self, sub, index, generator, layer):
        valid = sub > 0
        gamma = _draw("gamma", sub.shape, generator, sub.device, dtype=torch.float64,
                      concentration=float(self.alpha) + 1.0)
        u = 1.0 - _draw("rand", sub.shape, generator, sub.device, dtype=torch.float64)
        log_x = (gamma.log() + u.log() / self.alpha).masked_fill(~valid, float("-inf"))
        drawn = torch.softmax(log_x, dim=-1)
        return torch.where(valid.any(-1, keepdim=True), drawn, 0.0).to(sub.dtype)


@INTERVENTIONS.register("mean")
@dataclass(frozen=True, eq=False)
class Mean(_Base):
    """Mean-ablation (TransformerLens convention): each head's output replaced by a reference
    mean output, ``means[layer][head]`` (``[head, d_head]`` per layer), at every query.

    Acts on per-head outputs (``acts_on = "output"``), so it needs transformers' attention
    function (``capture(edit_output=...)``); compute ``means`` with
    :func:`attnprobe.perturb.context.head_output_means`.
    """

    means: Mapping[int, torch.Tensor] = field(default_factory=dict)
    name: ClassVar[str] = "mean"
    acts_on: ClassVar[ActsOn] = "output"

    def __post_init__(self) -> None:
        if not isinstance(self.means, Mapping) or not self.means:
            raise InputError("mean ablation needs means={layer: Tensor[head, d_head]}; compute "
                             "them with attnprobe.perturb.context.head_output_means")
        for layer, value in self.means.items():
            if not isinstance(value, torch.Tensor) or value.ndim != 2:
                raise InputError(f"means[{layer}] must be a [head, d_head] tensor")
            if not torch.isfinite(value).all():
                raise InputError(f"means[{layer}] holds NaN or inf")

    def check(self, layers: Sequence[int], n_heads: int) -> None:
        missing = [layer for layer in layers if layer not in self.means]
        if missing:
            raise InputError(f"mean ablation has no means for layers {missing} "
                             f"(it has {sorted(self.means)})")
        bad = [layer for layer in layers if n_heads and self.means[layer].shape[0] != n_heads]
        if bad:
            raise InputError(f"means of layers {bad} do not have {n_heads} heads")

    def _edit(self, sub, index, generator, layer):
        if layer is None or layer not in self.means:
            raise InputError(f"mean ablation has no means for layer {layer} "
                             f"(it has {sorted(self.means)})")
        mean = self.means[layer]
        if mean.shape[1] != sub.shape[-1] or int(index.max()) >= mean.shape[0]:
            raise InputError(f"means[{layer}] has shape {tuple(mean.shape)}; it needs heads "
                             f"{index.tolist()} and d_head {sub.shape[-1]}")
        picked = mean.to(sub.device, sub.dtype).index_select(0, index)  # [head, d]
        return picked[None, :, None, :].expand_as(sub).contiguous()
