"""Site selection: which layers and heads of the model a capture keeps.

The capture's :class:`~attnprobe.core.scope.Scope` names layers and heads; a seam asks, per
site, whether its layer is wanted (:meth:`SiteSelection.wants`) and which of its heads to
keep (:meth:`SiteSelection.head_index`: one grid of heads per stack, so that its layers stack
into one array). Scoped layers that no stack has are refused before any forward
(:meth:`SiteSelection.check_layers`).
"""

from __future__ import annotations

from attnprobe.capture.sites import Site
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError

__all__ = ["SiteSelection"]


class SiteSelection:
    """The sites and heads ``scope`` holds (module docstring)."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.layer_counts: dict[tuple[str, str], int] = {}
        self.n_layers = 0  # most layers of any stack, known before the forward
        self._heads: dict[tuple[Site, int], tuple[int, ...]] = {}

    def wants(self, site: Site) -> bool:
        """Whether ``site``'s layer holds a head of the scope."""
        return self.scope.wants_layer(site.layer)

    def head_index(self, n_heads: int, site: Site) -> tuple[int, ...]:
        """The heads kept at ``site``: the scope's heads over the scoped layers of its stack
        (one grid per stack, so layers stack into one array). Memoised: a decoding step
        asks again for every layer."""
        key = (site, n_heads)
        heads = self._heads.get(key)
        if heads is None:
            heads = self._heads[key] = self._head_index(n_heads, site)
        return heads

    def _head_index(self, n_heads: int, site: Site) -> tuple[int, ...]:
        count = self.layer_counts.get((site.stack, site.kind))
        if count is None:  # a stack found during the forward: the same cover for each layer
            named = (layer for layer, _ in self.scope.terms if layer is not None)
            count = max(named, default=0) + 1
        return self.scope.head_cover(self.scope.layers_in(max(count, site.layer + 1)), n_heads)

    def check_layers(self, counts: dict[tuple[str, str], int]) -> None:
        """Note the layers of each (stack, kind); raise before any forward when a scoped
        layer exists in no stack."""
        self.layer_counts = dict(counts)
        self.n_layers = max(counts.values(), default=0)
        layers = self.scope.layers
        if layers is None or not counts:
            return
        bad = [layer for layer in layers if layer >= self.n_layers]
        if bad:
            bad = bad[:5] + (["..."] if len(bad) > 5 else [])
            stacks = ", ".join(f"{s or 'model'} ({k}): 0..{n - 1}" for (s, k), n in counts.items())
            raise InputError(f"layers {bad} out of range; layers are {stacks}")
