"""The page's sections come from a registry: rank orders them, ``applies`` decides whether
they show, a new kind is one registration, and ids stay unique."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from attnprobe.errors import InputError
from attnprobe.report import SECTIONS, Contents, build, section
from attnprobe.report.sections import Section, table
from tests.unit.report.test_build import INFO, classified, random_map


def section_ids(html: str) -> list[str]:
    return re.findall(r'<section id="sec-([a-z0-9_-]+)">', html)


@pytest.fixture
def notes_kind():
    """A test kind ranked between the census (20) and the attention view (30), shown only
    when the contents hold maps; removed afterwards."""

    @section("notes", rank=25, applies=lambda c: bool(c.maps))
    def notes(contents: Contents) -> list[Section]:
        frame = pd.DataFrame({"maps": [len(contents.maps)]})
        return [Section("notes", "Notes", table(frame))]

    yield notes
    SECTIONS.unregister("notes")


def test_every_kind_is_registered_with_a_distinct_rank():
    ranks = {kind.name: kind.rank for kind in SECTIONS.values()}
    assert {"model", "census", "attention", "syntax", "comparison", "perturbation", "diff",
            "tables"} <= set(ranks)
    assert len(set(ranks.values())) == len(ranks)


def test_sections_show_in_rank_order_whatever_the_order_of_registration():
    comparison = pd.DataFrame({"source": ["rollout@L1"], "metric": ["spearman"], "mean": [0.3]})
    html = build(maps=[random_map(list("abc"))], census=classified(),
                 syntax=pd.DataFrame({"relation": ["all"]}), comparison=comparison,
                 perturbation=pd.DataFrame({"delta": [0.1]}),
                 tables=[("extra", "Extra", pd.DataFrame({"x": [1]}))]).html
    assert section_ids(html) == ["model", "heads", "profile", "attention", "syntax",
                                 "comparison", "perturbation", "extra"]


def test_a_new_kind_is_one_registration(notes_kind):
    html = build(maps=[random_map(list("abc"))], census=classified()).html
    assert section_ids(html) == ["model", "heads", "profile", "notes", "attention"]
    notes = html[html.index('<section id="sec-notes">'):]
    assert "<td>1</td>" in notes[:notes.index("</section>")]  # it read the contents
    # it does not apply without maps: absent, the rest unchanged
    assert section_ids(build(census=classified(), info=INFO).html) == ["model", "heads",
                                                                       "profile"]


def test_a_registered_name_cannot_be_taken_twice(notes_kind):
    with pytest.raises(ValueError, match="already registered"):
        section("notes", rank=99, applies=lambda c: True)(lambda c: [])


def test_a_table_keyed_like_a_built_in_section_is_refused():
    with pytest.raises(InputError, match=r"^the tables section sec-heads has the id of a "
                                         r"census section; choose another key$"):
        build(census=classified(), tables=[("Heads", "Mine", pd.DataFrame({"x": [1]}))])
    with pytest.raises(InputError, match="tables section sec-a-b has the id of a tables"):
        build(info=INFO, tables=[("a b", "1", pd.DataFrame({"x": [1]})),
                                 ("a-b", "2", pd.DataFrame({"x": [2]}))])


def test_the_report_keeps_its_contents():
    maps = [random_map(list("abc"))]
    page = build(maps=maps, census=classified())
    assert page.contents.maps == tuple(maps) and page.contents.info is maps[0].info
    assert page.contents.classified is page.contents.classified  # classified once per page
