"""Build one self-contained HTML report: all CSS/JS inlined, no URL to any other host.

Sections appear only when their data is given: model card (from ``maps[0].info`` or ``info``),
head grid / layer profile / head clusters (``census``), interactive attention view with the model
view and head panels (``maps``), syntax table, attribution comparison, perturbation results,
checkpoint diff and the caller's own tables. Results are drawn as inline SVG figures
(:mod:`.result_figures`) with their tables collapsed, and each section names its corpus size. The
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

from attnprobe.core import html_view
from attnprobe.core.display import counted, describe, quoted, size
from attnprobe.core.files import atomic_write
from attnprobe.errors import InputError
from attnprobe.report import data, sections
from attnprobe.report.sections import Section
from attnprobe.report.templating import asset, markup, render
from attnprobe.report.text import slug
from attnprobe.types import AttentionMap, ModelInfo

MAPS_ID = "ap-maps"
SYNTAX_MIN_COUNT = 20  # words a relation needs to be listed (the labels' default min_count)


@dataclass(frozen=True)
class Report:
    """A rendered report."""

    html: str
    title: str = "attnprobe report"

    @property
    def size_bytes(self) -> int:
        return len(self.html.encode("utf-8"))

    def __repr__(self) -> str:
        return describe("Report", quoted(self.title, 60), size(self.size_bytes),
                        counted(self.html.count("<section id="), "section"))

    def _repr_html_(self) -> str | None:
        """The page in a notebook, inside a sandboxed ``<iframe srcdoc>`` (its script and
        styles stay inside it)."""
        return html_view.html(self, "report")

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


def _classified(census: Any) -> pd.DataFrame | None:
    """``census.classify()`` (or the classified frame given), computed once per page."""
    if census is None:
        return None
    if isinstance(census, pd.DataFrame):
        return sections.census_tables(census)[0]
    return census.classify()


def build(*, maps: Sequence[AttentionMap] | AttentionMap | None = None, census: Any = None,
          syntax: pd.DataFrame | None = None, comparison: Any = None,
          perturbation: pd.DataFrame | None = None, diff: Any = None,
          title: str = "attnprobe report", info: ModelInfo | None = None,
          tables: Sequence[tuple[str, str, pd.DataFrame | None]] = (),
          min_count: int = SYNTAX_MIN_COUNT) -> Report:
    """Render the report.

    Args:
        maps: attention maps for the interactive views (one per sentence): the head view,
            the model view (every head as a thumbnail; a click opens it) and, with a
            census, the head panel (label, evidence, ``also``, scores) of the head clicked.
        census: a ``Census`` (classify / layer profile / clusters when distances exist) or a
            classified (or score) DataFrame.
        syntax: ``Census.syntax()``-shaped table; relations with fewer than ``min_count``
            words are left out (the page says how many).
        comparison: an attribution ``Comparison`` (agreement by layer and token heat
            figures) or its summary DataFrame.
        perturbation: a perturbation ``run()`` DataFrame (effect per head figure).
        diff: a checkpoint ``Diff`` (``ap.heads.diff``): change per head and per layer.
        info: model info for the card when there are no maps (else ``maps[0].info``).
        tables: more sections, ``(key, heading, table)`` each, with id ``sec-<slug of key>``
            (lower case; runs of characters other than ``a-z0-9_-`` become ``-``); empty or
            missing tables are left out.
        min_count: the fewest words a syntax relation needs to be listed (default 20, as
            the labels use).

    Returns:
        :class:`Report` with the HTML text. Every section says how many sentences it was
        computed on; figures are inline SVG with the raw tables collapsed under them.

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
            and perturbation is None and diff is None and not tables:
        raise InputError("nothing to report: pass maps, census, syntax, comparison, "
                         "perturbation or diff")
    n_census = getattr(census, "n_sentences", None)
    classified = _classified(census)
    parts = [Section("model", "Model", sections.model_card(info, maps))]
    if census is not None:
        parts += sections.census_sections(census, classified)
    if maps:
        parts.append(Section("attention", "Attention view",
                             sections.attention_view(sections.head_details(classified),
                                                     maps_id=MAPS_ID)))
    if syntax is not None:
        shown, dropped = sections.syntax_rows(_frame(syntax, "syntax"), min_count)
        note = (f"From {n_census} sentence(s); " if n_census is not None else "") + \
            f"relations with at least {min_count} words" + \
            (f" ({dropped} rarer left out)." if dropped else ".")
        parts.append(Section("syntax", "Syntax", sections.result(note, [], shown)))
    if comparison is not None:
        parts.append(Section("comparison", "Attribution comparison", sections.comparison_section(
            comparison, _frame(comparison, "comparison"), n_census)))
    if perturbation is not None:
        parts.append(Section("perturbation", "Perturbation", sections.perturbation_section(
            _frame(perturbation, "perturbation"))))
    if diff is not None:
        parts.append(Section("diff", "Checkpoint diff", sections.diff_section(diff)))
    parts += _extra_sections(tables, {part.id for part in parts})
    html = render("page.html.j2", title=str(title), sections=parts,
                  css=asset("report.css") + "\n" + asset("views.css"),
                  maps_id=MAPS_ID, js=asset("attention_view.js") if maps else "",
                  maps_json=markup(data.escape_json(data.pack_maps(maps))) if maps else "")
    return Report(html=str(html), title=str(title))
