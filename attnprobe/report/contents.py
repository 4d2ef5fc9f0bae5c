"""What a report page is built from, and the registry of the sections that show it.

:class:`Contents` holds the analysis results a page shows (maps, census, syntax table,
attribution comparison, perturbation run, checkpoint diff, the caller's own tables, direct
logit attribution, composition scores, a patching table). Every
kind of section is a :class:`SectionKind` registered in :data:`SECTIONS`: its ``rank`` (the
page shows the sections in increasing rank), ``applies(contents)`` (whether the contents hold
what it shows) and ``render(contents)`` (its :class:`~attnprobe.report.sections.Section`
objects). The kinds are modules of :mod:`attnprobe.report.section_kinds`, discovered when
:mod:`attnprobe.report` is imported (:func:`registered_sections`); the page asks every
registered kind in rank order, and the README's list of sections is written from this registry
(``make readme``). A new section is one module there, or one registration::

    @section("notes", rank=65, applies=lambda c: c.info is not None)
    def _notes(contents: Contents) -> list[Section]:
        return [Section("notes", "Notes", sections.table(notes_of(contents.info)))]

:func:`~attnprobe.report.from_model` computes the direct logit attribution and the
composition for pre-norm language models, and the patching table when it is given corrupted
inputs (:mod:`attnprobe.report.causal`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pandas as pd

from attnprobe.core.plugins import discover
from attnprobe.core.registry import Registry
from attnprobe.errors import InputError
from attnprobe.heads.head_census import MIN_COUNT
from attnprobe.report import sections
from attnprobe.report.sections import Section
from attnprobe.types import AttentionMap, ModelInfo

__all__ = ["KINDS_PACKAGE", "MAPS_ID", "SECTIONS", "Contents", "SectionKind", "as_frame",
           "page_sections", "registered_sections", "section"]

KINDS_PACKAGE = "attnprobe.report.section_kinds"

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
        faithfulness: a ``Faithfulness`` (``ap.faithfulness.evaluate``).
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
    faithfulness: Any = None

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
                                        self.composition, self.patching,
                                        self.faithfulness))

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
        shows: what it shows and when, one line (README and help).
    """

    name: str
    rank: int
    applies: Callable[[Contents], bool]
    render: Callable[[Contents], list[Section]]
    shows: str = ""


SECTIONS: Registry[SectionKind] = Registry("report section")

Render = Callable[[Contents], list[Section]]


def section(name: str, *, rank: int, applies: Callable[[Contents], bool], shows: str = ""
            ) -> Callable[[Render], Render]:
    """Register the decorated ``render(contents) -> [Section, ...]`` as section ``name``;
    ``shows`` (default: the first line of its docstring) says what it shows and when.

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
        told = shows or (render.__doc__ or "").strip().split("\n")[0]
        SECTIONS.register(name)(SectionKind(name, rank, applies, render, told))
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
    for kind in registered_sections():
        if not kind.applies(contents):
            continue
        for part in kind.render(contents):
            if part.id in made_by:
                raise InputError(f"the {kind.name} section sec-{part.id} has the id of a "
                                 f"{made_by[part.id]} section; choose another key")
            made_by[part.id] = kind.name
            out.append(part)
    return out


def registered_sections() -> list[SectionKind]:
    """Every section kind in rank order, the modules of :data:`KINDS_PACKAGE` imported first
    (each registers its kind on import; Python imports a module once).

    Example:
        >>> [kind.name for kind in registered_sections()][:3]
        ['model', 'census', 'attention']
    """
    discover(KINDS_PACKAGE)
    return sorted(SECTIONS.values(), key=lambda k: (k.rank, k.name))
