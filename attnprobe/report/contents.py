"""What a report page is built from, and the registry of the sections that show it.

:class:`Contents` holds the analysis results a page shows (maps, census, syntax table,
attribution comparison, perturbation run, checkpoint diff, the caller's own tables, direct
logit attribution, composition scores, a patching table). Every
kind of section is a :class:`SectionKind` registered in :data:`SECTIONS`: its ``rank`` (the
page shows the sections in increasing rank), ``applies(contents)`` (whether the contents hold
what it shows) and ``render(contents)`` (its :class:`~attnprobe.report.sections.Section`
objects). The page asks every registered kind in rank order; a new section is one
registration::

    @section("notes", rank=65, applies=lambda c: c.info is not None)
    def _notes(contents: Contents) -> list[Section]:
        return [Section("notes", "Notes", sections.table(notes_of(contents.info)))]

=====================  ====  =============================================================
kind                   rank  applies when the contents hold
=====================  ====  =============================================================
``model``              10    always (the model card; empty without info and maps)
``census``             20    a census (head grid, layer profile, clusters with distances)
``attention``          30    maps (head view, model view, head panels with a census)
``syntax``             40    a syntax table
``comparison``         50    an attribution comparison
``perturbation``       60    a perturbation run table
``diff``               70    a checkpoint diff
``tables``             90    the caller's ``(key, heading, table)`` sections
``logit-attribution``  100   a direct logit attribution (layer × head heatmap, top heads)
``composition``        110   composition scores (writer × reader over the random baseline,
                             strongest pairs)
``patching``           120   a patching table (effect per patch, per-patch summary)
=====================  ====  =============================================================

:func:`~attnprobe.report.from_model` computes the direct logit attribution and the
composition for pre-norm language models, and the patching table when it is given corrupted
inputs (:mod:`attnprobe.report.causal`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pandas as pd

from attnprobe.core.registry import Registry
from attnprobe.errors import InputError
from attnprobe.heads.head_census import MIN_COUNT
from attnprobe.report import sections
from attnprobe.report.circuit_views import composition_body, logit_attribution_body
from attnprobe.report.patching_views import patching_body
from attnprobe.report.sections import Section
from attnprobe.report.text import slug
from attnprobe.types import AttentionMap, ModelInfo

__all__ = ["MAPS_ID", "SECTIONS", "Contents", "SectionKind", "page_sections", "section"]

MAPS_ID = "ap-maps"  # id of the maps' JSON element, read by the attention views' script

Table = tuple[str, str, Any]  # (key, heading, DataFrame or an object with .summary())


def as_frame(value: Any, what: str) -> pd.DataFrame:
    """``value`` as a DataFrame: itself, or its ``summary()`` (e.g. a ``Comparison``)."""
    if isinstance(value, pd.DataFrame):
        return value
    if hasattr(value, "summary"):
        return value.summary()
    raise InputError(f"{what} must be a DataFrame; got {type(value).__name__}")


@dataclass(frozen=True)
class Contents:
    """The analysis results one page shows (each optional; see :func:`~attnprobe.report.build`).

    Attributes:
        maps: one attention map ``[layer, head, query, key]`` per shown sentence.
        census: a ``Census`` or a classified (or score) DataFrame.
        syntax: a ``Census.syntax()``-shaped table.
        comparison: an attribution ``Comparison`` or its summary DataFrame.
        perturbation: a perturbation ``run()`` table.
        diff: a checkpoint ``Diff``.
        info: the model card's model (``maps[0].info`` when not given).
        tables: the caller's ``(key, heading, table)`` sections.
        min_count: the fewest words a syntax relation needs to be listed.
        logit_attribution: a ``LogitAttribution`` (``ap.heads.logit_attribution``).
        composition: a ``Composition`` (``ap.heads.composition``).
        patching: a patching table (``ap.patch.heads`` / ``path`` / ``attribution``).
    """

    maps: tuple[AttentionMap, ...] = ()
    census: Any = None
    syntax: pd.DataFrame | None = None
    comparison: Any = None
    perturbation: pd.DataFrame | None = None
    diff: Any = None
    info: ModelInfo | None = None
    tables: tuple[Table, ...] = ()
    min_count: int = MIN_COUNT
    logit_attribution: Any = None
    composition: Any = None
    patching: pd.DataFrame | None = None

    def __post_init__(self) -> None:
        if not all(isinstance(m, AttentionMap) for m in self.maps):
            raise InputError("maps must be AttentionMap objects")
        if self.info is None and self.maps:
            object.__setattr__(self, "info", self.maps[0].info)

    @property
    def empty(self) -> bool:
        """Nothing to show: no model info and no result."""
        return self.info is None and not self.maps and not self.tables and all(
            value is None for value in (self.census, self.syntax, self.comparison,
                                        self.perturbation, self.diff, self.logit_attribution,
                                        self.composition, self.patching))

    @property
    def n_census(self) -> int | None:
        """How many sentences the census (the labels) was computed on, when known."""
        return getattr(self.census, "n_sentences", None)

    @cached_property
    def classified(self) -> pd.DataFrame | None:
        """``census.classify()`` (or the classified frame given), computed once per page."""
        if self.census is None:
            return None
        if isinstance(self.census, pd.DataFrame):
            return sections.census_tables(self.census)[0]
        return self.census.classify()


@dataclass(frozen=True)
class SectionKind:
    """One kind of section: where it goes, when it shows, how it renders.

    Attributes:
        name: the registry name.
        rank: its place on the page (increasing; ties in name order).
        applies: ``applies(contents)``: whether the contents hold what it shows.
        render: ``render(contents) -> [Section, ...]`` (one or more; ids unique per page).
    """

    name: str
    rank: int
    applies: Callable[[Contents], bool]
    render: Callable[[Contents], list[Section]]


SECTIONS: Registry[SectionKind] = Registry("report section")

Render = Callable[[Contents], list[Section]]


def section(name: str, *, rank: int, applies: Callable[[Contents], bool]
            ) -> Callable[[Render], Render]:
    """Register the decorated ``render(contents) -> [Section, ...]`` as section ``name``.

    Example:
        >>> @section("notes", rank=65, applies=lambda c: c.info is not None)
        ... def notes(contents):
        ...     frame = pd.DataFrame({"model": [contents.info.name]})
        ...     return [Section("notes", "Notes", sections.table(frame))]
        >>> try:
        ...     page = ap.report.build(maps=maps)
        ... finally:                                    # leave the registry as it was
        ...     _ = SECTIONS.unregister("notes")
        >>> 'id="sec-notes"' in page.html
        True
    """

    def add(render: Render) -> Render:
        SECTIONS.register(name)(SectionKind(name, rank, applies, render))
        return render

    return add


def page_sections(contents: Contents) -> list[Section]:
    """Every section that applies to ``contents``, in rank order.

    Raises:
        InputError: two sections with the same id (e.g. a caller's table keyed like a
            built-in section).
    """
    out: list[Section] = []
    made_by: dict[str, str] = {}  # section id -> the kind that made it
    for kind in sorted(SECTIONS.values(), key=lambda k: (k.rank, k.name)):
        if not kind.applies(contents):
            continue
        for part in kind.render(contents):
            if part.id in made_by:
                raise InputError(f"the {kind.name} section sec-{part.id} has the id of a "
                                 f"{made_by[part.id]} section; choose another key")
            made_by[part.id] = kind.name
            out.append(part)
    return out


# ----------------------------------------------------------------------------- the kinds
@section("model", rank=10, applies=lambda c: True)
def _model(contents: Contents) -> list[Section]:
    return [Section("model", "Model", sections.model_card(contents.info, contents.maps))]


@section("census", rank=20, applies=lambda c: c.census is not None)
def _census(contents: Contents) -> list[Section]:
    return sections.census_sections(contents.census, contents.classified)


@section("attention", rank=30, applies=lambda c: bool(c.maps))
def _attention(contents: Contents) -> list[Section]:
    details = sections.head_details(contents.classified)
    return [Section("attention", "Attention view",
                    sections.attention_view(details, maps_id=MAPS_ID))]


@section("syntax", rank=40, applies=lambda c: c.syntax is not None)
def _syntax(contents: Contents) -> list[Section]:
    shown, dropped = sections.syntax_rows(as_frame(contents.syntax, "syntax"),
                                          contents.min_count)
    n = contents.n_census
    note = (f"From {n} sentence(s); " if n is not None else "") + \
        f"relations with at least {contents.min_count} words" + \
        (f" ({dropped} rarer left out)." if dropped else ".")
    return [Section("syntax", "Syntax", sections.result(note, [], shown))]


@section("comparison", rank=50, applies=lambda c: c.comparison is not None)
def _comparison(contents: Contents) -> list[Section]:
    body = sections.comparison_section(contents.comparison,
                                       as_frame(contents.comparison, "comparison"),
                                       contents.n_census)
    return [Section("comparison", "Attribution comparison", body)]


@section("perturbation", rank=60, applies=lambda c: c.perturbation is not None)
def _perturbation(contents: Contents) -> list[Section]:
    body = sections.perturbation_section(as_frame(contents.perturbation, "perturbation"))
    return [Section("perturbation", "Perturbation", body)]


@section("diff", rank=70, applies=lambda c: c.diff is not None)
def _diff(contents: Contents) -> list[Section]:
    return [Section("diff", "Checkpoint diff", sections.diff_section(contents.diff))]


@section("tables", rank=90, applies=lambda c: bool(c.tables))
def _tables(contents: Contents) -> list[Section]:
    """The caller's ``(key, heading, table)`` sections; ids are slugs of the keys; empty or
    missing tables are left out."""
    return [Section(slug(key), str(heading), sections.table(frame))
            for key, heading, frame in _checked_tables(contents.tables)]


def _checked_tables(tables: Sequence[Any]) -> list[tuple[str, str, pd.DataFrame]]:
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


@section("logit-attribution", rank=100, applies=lambda c: c.logit_attribution is not None)
def _logit_attribution(contents: Contents) -> list[Section]:
    body = logit_attribution_body(contents.logit_attribution, of=contents.n_census)
    return [Section("logit-attribution", "Direct logit attribution", body)]


@section("composition", rank=110, applies=lambda c: c.composition is not None)
def _composition(contents: Contents) -> list[Section]:
    return [Section("composition", "Composition", composition_body(contents.composition))]


@section("patching", rank=120, applies=lambda c: c.patching is not None)
def _patching(contents: Contents) -> list[Section]:
    body = patching_body(as_frame(contents.patching, "patching"), of=contents.n_census)
    return [Section("patching", "Patching", body)]
