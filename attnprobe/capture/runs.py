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

The module seam marks each run with the module's forward hooks. The attention function needs
no hook (a hook on every attention module would cost each decoding step): a call of a module's
attention is a new run unless it passes the very query tensor of the module's last call in
this forward (differential attention calls twice with one query).
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

    deepest: dict[tuple[str, str], int] = field(default_factory=dict)
    looped: set[tuple[str, str]] = field(default_factory=set)

    def reached(self, base: Site) -> None:
        """The module whose site is ``base`` ran for the first time, as itself."""
        key = (base.stack, base.kind)
        if base.layer > self.deepest.get(key, -1):
            self.deepest[key] = base.layer

    def start(self, base: Site, previous: Run | None = None) -> Run:
        """A run of the module whose site is ``base`` begins; ``previous``: its last run in
        this forward, if it ran before."""
        key = (base.stack, base.kind)
        site = base
        if previous is not None or key in self.looped:
            self.looped.add(key)
            call = 0 if previous is None else previous.site.call + 1
            site = replace(base, layer=self.deepest.get(key, -1) + 1, call=call)
        if site.layer > self.deepest.get(key, -1):
            self.deepest[key] = site.layer
        return Run(site)
