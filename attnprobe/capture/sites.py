"""Where attention happens in a model: named sites (stack, kind, layer) and their paths."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from torch import nn

_INDEX = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")
_NESTED = re.compile(r"(\d+)\.(\d+)(?:\.|$)")
_CROSS_NAMES = (
    "crossattention", "cross_attn", "cross_attention", "encoder_attn", "encdecattention",
)


@dataclass(frozen=True)
class Site:
    """One attention computation of a model.

    ``stack`` is the module path of the layer list it belongs to (``encoder.layer``,
    ``model.decoder.layers``, ``blocks`` ...), ``layer`` its model index in that stack, and
    ``side`` which input its queries come from (``"decoder"`` for decoder stacks of
    encoder-decoder models, ``"main"`` otherwise). Cross-attention keys come from the main side.
    ``call`` is which run of its module this is, for modules that run several times in one
    forward (shared or looped layers; :mod:`attnprobe.capture.runs`), 0 otherwise.
    """

    path: str
    stack: str
    kind: Literal["self", "cross"]
    layer: int
    side: Literal["main", "decoder"] = "main"
    call: int = 0

    def __post_init__(self) -> None:
        # sites key the recorder's dicts at every attention call (each decoding step, each
        # layer): hash the fields once
        object.__setattr__(self, "_hash", hash((self.path, self.stack, self.kind, self.layer,
                                                self.side, self.call)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __setstate__(self, state: dict) -> None:
        # unpickled (e.g. gathered from another rank): a str hash is per process, recompute
        self.__dict__.update(state)
        self.__post_init__()

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.stack, self.kind, self.layer)

    @property
    def key_side(self) -> Literal["main", "decoder"]:
        return "main" if self.kind == "cross" else self.side


def _nested_layer(root: nn.Module | None, stack: str, path: str) -> int | None:
    """The model layer of ``stack.<block>.<i>...`` when the stack is a list of layer lists
    (Funnel's ``encoder.blocks``: blocks of several layers, pooled in between): the layers
    of the earlier blocks plus ``i``; ``None`` for a flat stack."""
    found = _NESTED.match(path[len(stack):].lstrip(".")) if stack else None
    if root is None or found is None:
        return None
    try:
        blocks = root.get_submodule(stack)
    except AttributeError:
        return None
    if not isinstance(blocks, nn.ModuleList) or not all(
            isinstance(block, nn.ModuleList) for block in blocks):
        return None
    block, index = int(found.group(1)), int(found.group(2))
    return sum(len(blocks[b]) for b in range(block)) + index


def site_for_path(path: str, module: nn.Module | None = None, *, encoder_decoder: bool = False,
                  fallback_layer: int = 0, root: nn.Module | None = None) -> Site:
    """Derive the site of an attention module (or hook point) from its path.

    The layer is the module's ``layer_idx`` when it has one (a negative one, which some
    models give a module outside the layer list, does not count), else the first integer in
    the path — counted across blocks when that integer indexes a list of layer lists of
    ``root`` (the model the path is in); the stack is the path up to that integer.
    """
    match = _INDEX.search(path)
    stack = path[: match.start(1)].rstrip(".") if match else ""
    layer = getattr(module, "layer_idx", None)
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        nested = _nested_layer(root, stack, path) if match else None
        layer = nested if nested is not None else (
            int(match.group(1)) if match else fallback_layer)
    lowered = path.lower().replace("_", "")
    cross = bool(getattr(module, "is_cross_attention", False)) or any(
        name.replace("_", "") in lowered for name in _CROSS_NAMES)
    side = "decoder" if encoder_decoder and "decoder" in path.lower() else "main"
    return Site(path=path, stack=stack, kind="cross" if cross else "self", layer=layer, side=side)


def layer_counts(sites: list[Site]) -> dict[tuple[str, str], int]:
    """Number of layers of each (stack, kind)."""
    counts: dict[tuple[str, str], int] = {}
    for site in sites:
        key = (site.stack, site.kind)
        counts[key] = max(counts.get(key, 0), site.layer + 1)
    return counts
