"""The caller's own ``(key, heading, table)`` sections."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from attnprobe.errors import InputError
from attnprobe.report import sections
from attnprobe.report.contents import Contents, as_frame, section
from attnprobe.report.sections import Section
from attnprobe.report.text import slug

RANK = 90


@section("tables", rank=RANK, applies=lambda c: bool(c.tables),
         shows="the caller's (key, heading, table) sections")
def render(contents: Contents) -> list[Section]:
    """The caller's ``(key, heading, table)`` sections; ids are slugs of the keys; empty or
    missing tables are left out."""
    return [Section(slug(key), str(heading), sections.table(frame))
            for key, heading, frame in checked_tables(contents.tables)]


def checked_tables(tables: Sequence[Any]) -> list[tuple[str, str, pd.DataFrame]]:
    """The ``(key, heading, DataFrame)`` triples that hold rows.

    Raises:
        InputError: an entry that is not a triple, a table that is not a DataFrame.
    """
    out = []
    for entry in tables:
        if not isinstance(entry, tuple | list) or len(entry) != 3:
            raise InputError("tables must hold (key, heading, DataFrame) triples")
        key, heading, frame = entry
        if frame is None:
            continue
        frame = as_frame(frame, f"table {key!r}")
        if not frame.empty:
            out.append((key, heading, frame))
    return out
