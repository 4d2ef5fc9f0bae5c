"""attnprobe.plot imports matplotlib and seaborn only when a figure is drawn, and a missing
extra is an error naming attnprobe[report]."""

from __future__ import annotations

import sys

import pandas as pd
import pytest

import attnprobe.plot as plot
from attnprobe.errors import MissingExtraError
from tests.helpers import fresh_python


def test_importing_the_package_imports_no_plotting_library():
    code = ("import sys, attnprobe, attnprobe.plot; "
            "print([m for m in ('matplotlib', 'seaborn') if m in sys.modules])")
    assert fresh_python(code) == "[]"


def test_every_registered_figure_is_exported():
    names = plot.FIGURES.names()
    assert {"attention_head", "head_grid", "agreement_by_layer", "head_effects",
            "patching_effect"} <= set(names)  # the documented core
    assert set(names) <= set(plot.__all__) and set(names) <= set(dir(plot))
    assert all(getattr(plot, name) is plot.FIGURES.get(name).draw for name in names)


@pytest.mark.parametrize("missing", ["matplotlib.figure", "seaborn"])
def test_a_missing_plotting_library_names_the_report_extra(monkeypatch, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # import now fails
    table = pd.DataFrame({"layer": [0], "head": [0], "offset": [0], "mass": [1.0]})
    with pytest.raises(MissingExtraError, match=r"attnprobe\[report\]"):
        plot.offset_profile(table)
