"""Build one self-contained HTML report: all CSS/JS inlined, no URL to any other host.

Sections appear only when their data is given: model card (from ``maps[0].info`` or ``info``),
head grid / layer profile / head clusters (``census``), interactive attention view (``maps``),
syntax table, attribution comparison, perturbation results and the caller's own tables. The
page is rendered from Jinja2 templates with autoescaping on (:mod:`.templating`): every token,
cell, heading, key and title is escaped, attributes included; ids are slugs; the maps travel as
escaped JSON (:mod:`.data`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from attnprobe.core.files import atomic_write
from attnprobe.errors import InputError
from attnprobe.report import data, sections
from attnprobe.report.sections import Section
from attnprobe.report.templating import asset, markup, render
from attnprobe.report.text import slug
from attnprobe.types import AttentionMap, ModelInfo

MAPS_ID = "ap-maps"


@dataclass(frozen=True)
class Report:
    """A rendered report."""

    html: str
    title: str = "attnprobe report"

    @property
    def size_bytes(self) -> int:
        return len(self.html.encode("utf-8"))

    def save(self, path: str | Path) -> Path:
        """Write the page to ``path`` atomically (a killed save leaves the old file or none)."""
        return atomic_write(path, lambda tmp: tmp.write_text(self.html, encoding="utf-8"))


def _frame(value: Any, what: str) -> pd.DataFrame:
    if isinstance(value, pd.DataFrame):
        return value
    if hasattr(value, "summary"):
        return value.summary()
    raise InputError(f"{what} must be a DataFrame; got {type(value).__name__}")


def _extra_sections(tables: Sequence[tuple[str, str, pd.DataFrame | None]],
                    taken: set[str]) -> list[Section]:
    """The caller's ``(key, heading, table)`` sections; ids are slugs of the keys."""
    out = []
    for entry in tables:
        if not isinstance(entry, tuple | list) or len(entry) != 3:
            raise InputError("tables must hold (key, heading, DataFrame) triples")
        key, heading, frame = entry
        if frame is None:
            continue
        frame = _frame(frame, f"table {key!r}")
        if frame.empty:
            continue
        section_id = slug(key)
        if section_id in taken:
            raise InputError(f"table key {key!r} gives the section id sec-{section_id}, which "
                             "is already used; choose another key")
        taken.add(section_id)
        out.append(Section(section_id, str(heading), sections.table(frame)))
    return out


def build(*, maps: Sequence[AttentionMap] | AttentionMap | None = None, census: Any = None,
          syntax: pd.DataFrame | None = None, comparison: Any = None,
          perturbation: pd.DataFrame | None = None, title: str = "attnprobe report",
          info: ModelInfo | None = None,
          tables: Sequence[tuple[str, str, pd.DataFrame | None]] = ()) -> Report:
    """Render the report.

    Args:
        maps: attention maps for the interactive view (one per sentence).
        census: a ``Census`` (classify / layer profile / clusters when distances exist) or a
            classified (or score) DataFrame.
        syntax: ``Census.syntax()``-shaped table.
        comparison: an attribution ``Comparison`` or its summary DataFrame.
        perturbation: a perturbation ``run()`` DataFrame.
        info: model info for the card when there are no maps (else ``maps[0].info``).
        tables: more sections, ``(key, heading, table)`` each, with id ``sec-<slug of key>``
            (lower case; runs of characters other than ``a-z0-9_-`` become ``-``); empty or
            missing tables are left out.

    Returns:
        :class:`Report` with the HTML text.

    Raises:
        InputError: nothing to report, maps that are not AttentionMaps, a table that is not
            a DataFrame, or two sections with the same id.
        MissingExtraError: jinja2 (the ``report`` extra) is not installed.
    """
    if isinstance(maps, AttentionMap):
        maps = [maps]
    maps = list(maps or [])
    if not all(isinstance(m, AttentionMap) for m in maps):
        raise InputError("maps must be AttentionMap objects")
    if info is None and maps:
        info = maps[0].info
    if info is None and not maps and census is None and syntax is None and comparison is None \
            and perturbation is None and not tables:
        raise InputError("nothing to report: pass maps, census, syntax, comparison or "
                         "perturbation")
    parts = [Section("model", "Model", sections.model_card(info, maps))]
    if census is not None:
        parts += sections.census_sections(census)
    if maps:
        parts.append(Section("attention", "Attention view", sections.attention_view()))
    for key, heading, value in (("syntax", "Syntax", syntax),
                                ("comparison", "Attribution comparison", comparison),
                                ("perturbation", "Perturbation", perturbation)):
        if value is not None:
            parts.append(Section(key, heading, sections.table(_frame(value, key))))
    parts += _extra_sections(tables, {part.id for part in parts})
    html = render("page.html.j2", title=str(title), sections=parts, css=asset("report.css"),
                  maps_id=MAPS_ID, js=asset("attention_view.js") if maps else "",
                  maps_json=markup(data.escape_json(data.pack_maps(maps))) if maps else "")
    return Report(html=str(html), title=str(title))
