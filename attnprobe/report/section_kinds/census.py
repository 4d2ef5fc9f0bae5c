"""The census: head grid, layer profile and clusters."""

from __future__ import annotations

from attnprobe.report import sections
from attnprobe.report.contents import Contents, section
from attnprobe.report.sections import Section

RANK = 20


@section("census", rank=RANK, applies=lambda c: c.census is not None,
         shows="a census: head grid, layer profile, clusters with distances")
def render(contents: Contents) -> list[Section]:
    return sections.census_sections(contents.census, contents.classified)
