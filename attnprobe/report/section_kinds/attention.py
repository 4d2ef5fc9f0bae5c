"""The attention view: head view, model view, head panels."""

from __future__ import annotations

from attnprobe.report import sections
from attnprobe.report.contents import MAPS_ID, Contents, section
from attnprobe.report.sections import Section

RANK = 30


@section("attention", rank=RANK, applies=lambda c: bool(c.maps),
         shows="maps: head view, model view (head panels with a census)")
def render(contents: Contents) -> list[Section]:
    details = sections.head_details(contents.classified)
    return [Section("attention", "Attention view",
                    sections.attention_view(details, maps_id=MAPS_ID))]
