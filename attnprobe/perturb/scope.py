"""Where an attention intervention applies: :class:`Scope` (layers × heads, with its
command-line form) and :func:`attention_sizes` (a model's layer and head counts).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from attnprobe.errors import InputError

__all__ = ["Scope", "attention_sizes"]


_HEAD = re.compile(r"^L?(\d+|\*)[.H](\d+)$", re.IGNORECASE)


def _indices(name: str, values: Sequence[int] | int | None) -> tuple[int, ...] | None:
    if values is None:
        return None
    values = (values,) if isinstance(values, int) else tuple(values)
    if not values:
        raise InputError(f"scope {name} must not be empty; use None for all")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 0]
    if bad:
        raise InputError(f"scope {name} must be non-negative integers; got {bad}")
    return tuple(sorted(set(values)))


def attention_sizes(model: nn.Module) -> tuple[int, int]:
    """``(n_layers, n_heads)`` of a model's attention (0 when unknown).

    Layers are counted from the attention sites the capture seam will see (the longest stack),
    heads come from the config (``num_attention_heads``, ``n_heads`` ...), as in
    :func:`attnprobe.capture.info.model_info`.
    """
    from attnprobe.capture import hf, hooks
    from attnprobe.capture.info import model_info
    from attnprobe.capture.sites import layer_counts

    if hf.is_hf_model(model):
        sites = hf.hf_sites(model)
    else:
        paths = hooks.hook_point_paths(model)
        sites = hooks.path_sites(model, paths) if paths else []
    info = model_info(model, implementation="")
    n_layers = max(layer_counts(sites).values(), default=0) or info.n_layers
    return n_layers, info.n_heads


@dataclass(frozen=True)
class Scope:
    """Which attention heads an intervention touches: ``layers × heads`` (model indices).

    ``None`` means all. ``Scope()`` is every head of every layer, ``Scope(layers=(3,))`` every
    head of layer 3, ``Scope((3,), (5, 7))`` heads 5 and 7 of layer 3. On encoder-decoder
    models a layer index selects that layer in every attention stack.

    Parse the command-line form with :meth:`parse`; ``str(scope)`` gives it back.
    """

    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", _indices("layers", self.layers))
        object.__setattr__(self, "heads", _indices("heads", self.heads))

    @classmethod
    def parse(cls, text: str | Scope) -> Scope:
        """``"all"``, ``"layer:3"``, ``"layers:2,3"``, ``"head:3.5"``, ``"heads:3.5,3.7"``
        (also ``L3H5``; ``*.5`` = head 5 of every layer).

        A list of heads must form a product of layers and heads (``3.5,4.5`` is fine,
        ``3.5,4.7`` is not: use two scopes).
        """
        if isinstance(text, Scope):
            return text
        if not isinstance(text, str):
            raise InputError(f"scope must be a string such as 'layer:3'; got {type(text).__name__}")
        spec = text.strip().lower().replace(" ", "")
        if spec in ("all", ""):
            return cls()
        kind, _, rest = spec.partition(":")
        items = [item for item in rest.split(",") if item]
        if not items:
            raise InputError(f"scope {text!r} names nothing after the colon; e.g. 'layer:3'")
        if kind in ("layer", "layers"):
            if not all(item.isdigit() for item in items):
                raise InputError(f"scope {text!r}: layers must be integers, e.g. 'layers:2,3'")
            return cls(layers=tuple(int(item) for item in items))
        if kind in ("head", "heads"):
            pairs = []
            for item in items:
                match = _HEAD.match(item)
                if match is None:
                    raise InputError(f"scope {text!r}: {item!r} is not a head; write "
                                     "<layer>.<head> such as 3.5 (or L3H5, *.5)")
                layer = None if match.group(1) == "*" else int(match.group(1))
                pairs.append((layer, int(match.group(2))))
            layer_set = {layer for layer, _ in pairs}
            head_set = {head for _, head in pairs}
            if None in layer_set and len(layer_set) > 1:
                raise InputError(f"scope {text!r} mixes '*' with layer numbers")
            if len(set(pairs)) != len(layer_set) * len(head_set):
                raise InputError(f"scope {text!r} is not a product of layers and heads; split it "
                                 "into one scope per layer")
            layers = None if None in layer_set else tuple(layer_set)
            return cls(layers=layers, heads=tuple(head_set))
        raise InputError(f"scope {text!r}: use 'all', 'layer:3', 'layers:2,3', 'head:3.5' or "
                         "'heads:3.5,3.7'")

    def __str__(self) -> str:
        if self.heads is None:
            return "all" if self.layers is None else "layers:" + ",".join(map(str, self.layers))
        layers = ["*"] if self.layers is None else [str(layer) for layer in self.layers]
        return "heads:" + ",".join(f"{layer}.{head}" for layer in layers for head in self.heads)

    def validate(self, model: nn.Module) -> Scope:
        """Raise InputError when a layer or head is not in ``model``; return ``self``."""
        n_layers, n_heads = attention_sizes(model)
        for what, wanted, size in (("layers", self.layers, n_layers),
                                   ("heads", self.heads, n_heads)):
            bad = [i for i in wanted or () if size and i >= size]
            if bad:
                raise InputError(f"scope {self}: {what} {bad} out of range; "
                                 f"{type(model).__name__} has {size} {what} (0..{size - 1})")
        return self

    def resolved_layers(self, model: nn.Module) -> tuple[int, ...]:
        """The model layer indices in scope (all layers when ``layers`` is None)."""
        return self.layers if self.layers is not None else tuple(range(attention_sizes(model)[0]))
