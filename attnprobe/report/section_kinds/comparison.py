"""Attribution comparison: attention views against attribution methods."""

from __future__ import annotations

from attnprobe.report import sections
from attnprobe.report.contents import Contents, as_frame, section
from attnprobe.report.sections import Section

RANK = 50


@section("comparison", rank=RANK, applies=lambda c: c.comparison is not None,
         shows="an attribution comparison: agreement by layer, token heat")
def render(contents: Contents) -> list[Section]:
    body = sections.comparison_section(contents.comparison,
                                       as_frame(contents.comparison, "comparison"),
                                       contents.n_census)
    return [Section("comparison", "Attribution comparison", body)]
