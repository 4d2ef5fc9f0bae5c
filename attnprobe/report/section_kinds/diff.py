"""Checkpoint diff: how each head changed between two checkpoints."""

from __future__ import annotations

from attnprobe.report import sections
from attnprobe.report.contents import Contents, section
from attnprobe.report.sections import Section

RANK = 70


@section("diff", rank=RANK, applies=lambda c: c.diff is not None,
         shows="a checkpoint diff: attention change and label change per head")
def render(contents: Contents) -> list[Section]:
    return [Section("diff", "Checkpoint diff", sections.diff_section(contents.diff))]
