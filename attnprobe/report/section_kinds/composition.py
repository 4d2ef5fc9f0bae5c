"""Composition: Q/K/V-composition between heads, from the weights."""

from __future__ import annotations

from attnprobe.report.circuit_views import composition_body
from attnprobe.report.contents import Contents, section
from attnprobe.report.sections import Section

RANK = 110


@section("composition", rank=RANK, applies=lambda c: c.composition is not None,
         shows="composition scores: writer × reader over the random baseline, strongest pairs")
def render(contents: Contents) -> list[Section]:
    return [Section("composition", "Composition", composition_body(contents.composition))]
