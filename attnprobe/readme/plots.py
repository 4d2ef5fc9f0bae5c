"""The README's table of figures, written from :data:`~attnprobe.plot.figure.FIGURES` (and
which of them the report draws, :data:`~attnprobe.report.figure_svg.SVG_RENDERERS`)."""

from __future__ import annotations

from attnprobe.readme import ReadmePart


def markdown() -> str:
    """One row per figure, in rank order: its function, what it draws, from what, its data
    function and whether the report draws it."""
    from attnprobe.plot.figure import registered_figures  # the report extra: on use
    from attnprobe.report.figure_svg import registered_svg

    in_report = set(registered_svg())
    rows = ["| figure | draws | from | data | in the report |", "|---|---|---|---|---|"]
    rows += [f"| `ap.plot.{f.name}` | {f.shows.replace('``', '`')} | {f.source.replace('``', '`')} "
             f"| `{f.data.__name__}` | {'SVG' if f.name in in_report else ''} |"
             for f in registered_figures()]
    return "\n".join(rows)


PART = ReadmePart("plots", markdown)
