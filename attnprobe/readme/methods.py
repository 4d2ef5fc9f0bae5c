"""The README's list of attribution methods (``generated:methods``), one entry per method of
:data:`attnprobe.attribution.method_base.METHODS` in name order."""

from __future__ import annotations

from attnprobe.attribution import METHODS
from attnprobe.readme import ReadmePart, bullet, entry_help


def methods_markdown() -> str:
    """One bullet: the registry, then every method's name and what it computes."""
    entries = [f"`{name}`: {entry_help(METHODS.get(name))}" for name in METHODS.names()]
    return bullet("**Attribution methods** (`attnprobe.attribution.methods`, Captum behind one "
                  f"registry `METHODS`): {'; '.join(entries)}.")


PART = ReadmePart("methods", methods_markdown)
