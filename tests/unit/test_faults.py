"""Faults 5, 6 and 9 of issue 11 ("One house") that are not tested next to their module:
crafted map files through ``attnprobe report --maps``, census arguments that gave silent or
raw results, and a model on the ``meta`` device."""

from __future__ import annotations

import re

import pytest

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.heads.head_census import census
from tests.helpers import run_cli
from tests.unit.crafted_files import CASES, real_pair


@pytest.fixture(scope="module")
def encoder():
    return ap.load_model("ref:encoder")


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_maps_on_a_crafted_file_is_one_line_and_exit_2(case, tmp_path, capsys):
    build, message = CASES[case]
    build(tmp_path)
    page = tmp_path / "r.html"
    code, printed, err = run_cli(["report", "--maps", str(tmp_path / "maps.npz"),
                                  "--out", str(page)], capsys)
    assert code == 2 and printed == ""
    assert err.startswith("attnprobe: error:") and err.count("\n") == 1, err
    assert re.search(message, err) and "Traceback" not in err and not page.exists()


def test_report_maps_on_a_good_file_still_works(tmp_path, capsys):
    real_pair(tmp_path)
    page = tmp_path / "r.html"
    code, printed, err = run_cli(["report", "--maps", str(tmp_path / "maps.npz"),
                                  "--out", str(page)], capsys)
    assert code == 0, err
    assert page.read_text().count("q1") >= 1 and str(page) in printed


@pytest.mark.parametrize("rows", [0, -1, True, 2.0, "4"])
def test_census_similarity_rows_must_be_a_positive_integer(rows, encoder):
    # 0 gave all distances 0 (silently), -1 a torch RuntimeError. (The CLI has no option for
    # it: `heads` always uses the default.)
    model, tokenizer = encoder
    with pytest.raises(InputError, match=f"similarity_rows must be a positive integer or None "
                                         f"\\(every row\\); got {rows!r}"):
        census(model, tokenizer, ["the cat sat"], similarity_rows=rows, progress=False)


def test_census_similarity_rows_none_and_a_cover_agree(encoder):
    # every row (None) and more rows than the texts have are the same computation
    model, tokenizer = encoder
    texts = ["the cat sat on the mat", "a dog ran"]
    every = census(model, tokenizer, texts, similarity_rows=None, progress=False).distances()
    cover = census(model, tokenizer, texts, similarity_rows=64, progress=False).distances()
    assert every.equals(cover) and (every["js"] > 0).all()


@pytest.mark.parametrize("run", ["extract", "census", "capture"])
def test_a_model_on_the_meta_device_is_an_input_error(run, encoder):
    model, tokenizer = ap.load_model("ref:encoder")
    model.to("meta")

    def captured(model, tokenizer, texts, **kwargs):
        with ap.capture(model):
            model(**tokenizer(texts))

    analysis = {"extract": ap.extract, "census": census, "capture": captured}[run]
    with pytest.raises(InputError, match="on the 'meta' device"):
        analysis(model, tokenizer, ["the cat sat"], progress=False)


def test_census_trees_must_be_trees(encoder):
    from attnprobe.heads.trees import Tree

    model, tokenizer = encoder
    tree = Tree("s", ("the", "cat"), (2, 0), ("det", "root"))
    with pytest.raises(InputError, match=r"trees\[1\] is a str, not a Tree"):
        census(model, tokenizer, trees=[tree, "the cat"], progress=False)
    with pytest.raises(InputError, match="wrap a single tree in a list"):
        census(model, tokenizer, trees=tree, progress=False)
