"""Runs of attention modules within one forward: which layer each run is, and which softmax.

Most models run each attention module once per forward, and a module's site
(:class:`~attnprobe.capture.sites.Site`) is its layer. Some run a module several times:

- **shared or looped layers** (ALBERT's one layer applied ``num_hidden_layers`` times,
  recurrent-depth models): each run is its own layer, numbered by depth — once a module of a
  stack runs a second time in a forward, that stack's runs take the next depth (one past the
  deepest layer seen), so ALBERT's runs are layers ``0 .. n-1`` as in the model's own
  ``attentions`` output. ``Site.call`` says which run of its module a layer is;
- **several attention computations in one run** (differential attention's two softmaxes):
  the first is the layer's attention; the k-th after it is kept apart, on the stack
  ``"<stack>#<k+1>"`` (``layers#2``), so it never mixes with the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from attnprobe.capture.sites import Site

__all__ = ["Run", "Runs", "part_stack"]


def part_stack(stack: str, part: int) -> str:
    """The stack of the ``part``-th attention computation (0-based) of a module run."""
    return stack if part == 0 else f"{stack}#{part + 1}"


@dataclass
class Run:
    """One run of an attention module's forward: its site and the computations seen so far."""

    site: Site
    parts: int = 0

    def next_site(self) -> Site:
        """The site of the next attention computation inside this run."""
        site = self.site if self.parts == 0 else replace(
            self.site, stack=part_stack(self.site.stack, self.parts))
        self.parts += 1
        return site


@dataclass
class Runs:
    """Runs of every attention module in one forward call (module docstring)."""

    count: dict[Site, int] = field(default_factory=dict)
    deepest: dict[tuple[str, str], int] = field(default_factory=dict)
    looped: set[tuple[str, str]] = field(default_factory=set)

    def start(self, base: Site) -> Run:
        """A run of the module whose site is ``base`` begins."""
        key = (base.stack, base.kind)
        before = self.count.get(base, 0)
        self.count[base] = before + 1
        site = base
        if before or key in self.looped:
            self.looped.add(key)
            site = replace(base, layer=self.deepest.get(key, -1) + 1, call=before)
        self.deepest[key] = max(self.deepest.get(key, -1), site.layer)
        return Run(site)
