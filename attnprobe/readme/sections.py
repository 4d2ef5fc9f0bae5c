"""The README's list of report sections, written from
:data:`~attnprobe.report.contents.SECTIONS`."""

from __future__ import annotations

from attnprobe.readme import ReadmePart


def markdown() -> str:
    """One row per section kind, in page order: its name, rank and what it shows."""
    from attnprobe.report.contents import registered_sections  # the report extra: on use

    rows = ["| section | rank | shows, when the report is given |", "|---|---|---|"]
    rows += [f"| `{kind.name}` | {kind.rank} | {kind.shows} |" for kind in registered_sections()]
    return "\n".join(rows)


PART = ReadmePart("sections", markdown)
