"""Perturbation: the effect per head of a perturbation run."""

from __future__ import annotations

from attnprobe.report import sections
from attnprobe.report.contents import Contents, as_frame, section
from attnprobe.report.sections import Section

RANK = 60


@section("perturbation", rank=RANK, applies=lambda c: c.perturbation is not None,
         shows="a perturbation run table: effect per head, summary")
def render(contents: Contents) -> list[Section]:
    body = sections.perturbation_section(as_frame(contents.perturbation, "perturbation"))
    return [Section("perturbation", "Perturbation", body)]
