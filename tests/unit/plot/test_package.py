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


def test_every_entry_point_is_exported():
    assert sorted(plot.__all__) == sorted(
        ["agreement_by_layer", "attention_head", "composition", "generation_attention",
         "head_clusters", "head_effects", "head_grid", "layer_profile", "logit_attribution",
         "model_view", "offset_profile", "patching_effect", "pruning_curve", "syntax_accuracy",
         "token_heat"])
    assert all(callable(getattr(plot, name)) for name in plot.__all__)


@pytest.mark.parametrize("missing", ["matplotlib.figure", "seaborn"])
def test_a_missing_plotting_library_names_the_report_extra(monkeypatch, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # import now fails
    table = pd.DataFrame({"layer": [0], "head": [0], "offset": [0], "mass": [1.0]})
    with pytest.raises(MissingExtraError, match=r"attnprobe\[report\]"):
        plot.offset_profile(table)
