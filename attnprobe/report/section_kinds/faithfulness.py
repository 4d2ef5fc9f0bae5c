"""Faithfulness: which explanation the model agrees with (erasure tests of every source)."""

from __future__ import annotations

from attnprobe.report.contents import Contents, section
from attnprobe.report.faithfulness_views import faithfulness_body
from attnprobe.report.sections import Section

RANK = 55


@section("faithfulness", rank=RANK, applies=lambda c: c.faithfulness is not None,
         shows="a faithfulness result: ranked summary with CIs, deletion curves, ranking")
def render(contents: Contents) -> list[Section]:
    return [Section("faithfulness", "Faithfulness", faithfulness_body(contents.faithfulness))]
