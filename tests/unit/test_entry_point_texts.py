"""Issue 24 item 11: ``None``, a number or a float as ``texts`` get the one-line
:class:`~attnprobe.errors.InputError` every entry point gives (``ap.extract``'s), never a raw
``TypeError``, in ``ap.perturb.run``, ``ap.perturb.knockout`` and ``ap.report.from_model``."""

from __future__ import annotations

import pytest

import attnprobe as ap


@pytest.fixture(scope="module")
def induction():
    return ap.load_model("ref:induction")


ENTRY_POINTS = {
    "perturb.run": lambda m, t, texts: ap.perturb.run(m, t, texts, "uniform"),
    "perturb.knockout": lambda m, t, texts: ap.perturb.knockout(m, t, texts, "to:0"),
    "report.from_model": lambda m, t, texts: ap.report.from_model(m, t, texts),
}


@pytest.mark.parametrize("texts", [None, 5, 3.5])
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_texts_that_are_not_texts_get_the_one_line_error(induction, entry, texts):
    model, tok = induction
    with pytest.raises(ap.InputError) as reference:
        ap.extract(model, tok, texts)
    with pytest.raises(ap.InputError) as err:
        ENTRY_POINTS[entry](model, tok, texts)
    assert str(err.value) == str(reference.value) and "\n" not in str(err.value)
