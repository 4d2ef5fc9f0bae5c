"""The README's list of attention views (``generated:views``), one entry per view of
:data:`attnprobe.attribution.view_base.VIEWS` in name order (the order ``compare`` runs them)."""

from __future__ import annotations

from attnprobe.attribution import VIEWS
from attnprobe.readme import ReadmePart, bullet, entry_help


def views_markdown() -> str:
    """One bullet: the registry, then every view's name and what it reads."""
    entries = [f"`{name}`: {entry_help(VIEWS.get(name))}" for name in VIEWS.names()]
    return bullet("**Attention views** (`attnprobe.attribution.views`, one registry `VIEWS` "
                  f"like the methods'): {'; '.join(entries)}.")


PART = ReadmePart("views", views_markdown)
