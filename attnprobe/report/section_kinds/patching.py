"""Patching: the effect of each patch of a patching table."""

from __future__ import annotations

from attnprobe.report.contents import Contents, as_frame, section
from attnprobe.report.patching_views import patching_body
from attnprobe.report.sections import Section

RANK = 120


@section("patching", rank=RANK, applies=lambda c: c.patching is not None,
         shows="a patching table: effect per patch, per-patch summary")
def render(contents: Contents) -> list[Section]:
    body = patching_body(as_frame(contents.patching, "patching"), of=contents.n_census)
    return [Section("patching", "Patching", body)]
