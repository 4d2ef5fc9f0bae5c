"""The README's list of streaming reducers (``generated:reducers``), one entry per reducer of
:data:`attnprobe.core.reducers.REDUCERS` in name order: its class, what it sums, the census
statistic it is a view of (:class:`~attnprobe.heads.stat_views.StatView`), and whether it is
part of the default summary (:data:`~attnprobe.core.reducers.DEFAULT_REDUCERS`)."""

from __future__ import annotations

from attnprobe.core.reducers import DEFAULT_REDUCERS, REDUCERS
from attnprobe.heads.stat_views import StatView
from attnprobe.readme import ReadmePart, bullet, entry_help


def reducer_entry(name: str) -> str:
    """``name``'s line: class, help, the statistic it views, default or not."""
    entry = REDUCERS.get(name)
    notes = []
    if isinstance(entry, type) and issubclass(entry, StatView):
        notes.append(f"a view of the census statistic `{entry.stat}`")
    if name in DEFAULT_REDUCERS:
        notes.append("default")
    extra = f" ({', '.join(notes)})" if notes else ""
    return bullet(f"`{entry.__name__}` (`{name}`): {entry_help(entry)}{extra}.")


def reducers_markdown() -> str:
    """One bullet per registered reducer."""
    return "\n".join(reducer_entry(name) for name in REDUCERS.names())


PART = ReadmePart("reducers", reducers_markdown)
