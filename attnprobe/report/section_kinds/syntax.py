"""Syntax: the best head and the best fixed offset per dependency relation."""

from __future__ import annotations

from attnprobe.report import sections
from attnprobe.report.contents import Contents, as_frame, section
from attnprobe.report.sections import Section

RANK = 40


@section("syntax", rank=RANK, applies=lambda c: c.syntax is not None,
         shows="a syntax table: relations with enough words")
def render(contents: Contents) -> list[Section]:
    shown, dropped = sections.syntax_rows(as_frame(contents.syntax, "syntax"),
                                          contents.min_count)
    n = contents.n_census
    note = (f"From {n} sentence(s); " if n is not None else "") + \
        f"relations with at least {contents.min_count} words" + \
        (f" ({dropped} rarer left out)." if dropped else ".")
    return [Section("syntax", "Syntax", sections.result(note, [], shown))]
