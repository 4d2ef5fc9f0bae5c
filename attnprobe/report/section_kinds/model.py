"""The model card: the model's identity and the input sentences."""

from __future__ import annotations

from attnprobe.report import sections
from attnprobe.report.contents import Contents, section
from attnprobe.report.sections import Section

RANK = 10


@section("model", rank=RANK, applies=lambda c: True,
         shows="always: the model card (name, architecture, layers × heads, dtype, versions; "
               "the inputs, one element per token)")
def render(contents: Contents) -> list[Section]:
    return [Section("model", "Model", sections.model_card(contents.info, contents.maps))]
