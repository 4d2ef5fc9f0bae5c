"""Direct logit attribution: each head's direct part of the metric."""

from __future__ import annotations

from attnprobe.report.circuit_views import logit_attribution_body
from attnprobe.report.contents import Contents, section
from attnprobe.report.sections import Section

RANK = 100


@section("logit-attribution", rank=RANK, applies=lambda c: c.logit_attribution is not None,
         shows="a direct logit attribution: layer × head heatmap, top heads")
def render(contents: Contents) -> list[Section]:
    body = logit_attribution_body(contents.logit_attribution, of=contents.n_census)
    return [Section("logit-attribution", "Direct logit attribution", body)]
