"""Figures, their SVG twins and report sections are discovered registry entries: each figure is
one data function with its renderers beside it, a new figure is one module of
``attnprobe.plot`` (plus one of ``attnprobe.report.svg_figures`` for the report), a new
section one module of ``attnprobe.report.section_kinds``; ``ap.plot``, the page and the
README's tables follow. The throw-away extension here is written as module files in a
temporary folder."""

from __future__ import annotations

import importlib
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import attnprobe as ap
import attnprobe.plot as plot_package
import attnprobe.report.section_kinds as section_package
import attnprobe.report.svg_figures as svg_package
from attnprobe.plot.figure import FIGURES, registered_figures
from attnprobe.readme import render_readme
from attnprobe.report.contents import SECTIONS, registered_sections
from attnprobe.report.figure_svg import SVG_RENDERERS, registered_svg

README = Path(__file__).resolve().parents[3] / "README.md"


# ---- invariants over the registries -------------------------------------------------------
def test_every_figure_has_a_data_function_help_and_a_distinct_rank():
    found = registered_figures()
    names = [f.name for f in found]
    assert {"attention_head", "model_view", "head_grid", "agreement_by_layer", "token_heat",
            "head_effects", "patching_effect"} <= set(names)  # the documented core
    ranks = [f.rank for f in found]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    for f in found:
        assert f.shows.strip() and f.source.strip(), f.name
        assert callable(f.data) and f.data.__doc__, f.name  # a documented tidy-table function
        assert f.draw.__module__.startswith("attnprobe.plot."), f.name


def test_every_svg_renderer_draws_a_registered_figure():
    assert set(registered_svg()) <= set(FIGURES.names())
    assert {"head_effects", "agreement_by_layer", "token_heat", "patching_effect"} <= \
        set(registered_svg())


def test_the_plot_package_keeps_no_import_list_and_its_docstring_lists_every_figure():
    source = Path(plot_package.__file__).read_text()
    assert "from attnprobe.plot." not in source.replace("from attnprobe.plot.figure", "")
    for name in FIGURES.names():
        assert f":func:`{name}`" in plot_package.__doc__


def test_every_section_has_help_and_a_distinct_rank():
    kinds = registered_sections()
    ranks = [k.rank for k in kinds]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    assert all(k.shows.strip() for k in kinds)
    source = Path(section_package.__file__).read_text()
    assert "from attnprobe" not in source and "import attnprobe" not in source


def test_the_report_and_ap_plot_draw_the_same_table():
    """The head-effects figure: its data function runs once per page and both renderers
    draw what it returns."""
    table = pd.DataFrame({"experiment": "ablate", "scope": ["head:0.1", "head:1.0"],
                          "example_id": "0", "metric": "tvd", "baseline": 0.0,
                          "perturbed": [0.25, 0.5], "change": [0.25, 0.5]})
    calls = []
    real = FIGURES.unregister("head_effects")
    FIGURES.register("head_effects")(replace(real, data=lambda t: calls.append(t) or
                                             real.data(t)))
    try:
        html = ap.report.build(perturbation=table).html
    finally:
        FIGURES.unregister("head_effects")
        FIGURES.register("head_effects")(real)
    assert len(calls) == 1 and calls[0] is table
    section = html[html.index('<section id="sec-perturbation">'):]
    assert "tvd change 0.25" in section and "tvd change 0.5" in section


# ---- a throw-away figure, its SVG twin and a section showing it ---------------------------
NAME, SECTION = "mean_change", "mean-change"
MODULE = "throwaway_mean_change"  # not the figure's name: ap.plot.<module> would be the module
FIGURE_MODULE = '''"""A test's figure: the mean change of each metric of a perturbation run."""
from attnprobe.plot.common import axes_for, done
from attnprobe.plot.figure import figure

RANK = 95


def mean_change_table(table):
    """One row per metric: ``metric, change`` (its mean over the rows)."""
    return table.groupby("metric", sort=False, as_index=False)["change"].mean()


@figure(data=mean_change_table, rank=95, shows="mean change per metric (a test's)",
        source="``perturb.run`` table")
def mean_change(table, *, ax=None):
    means = mean_change_table(table)
    fig, axes = axes_for(ax, 4, 3)
    axes.bar(list(means["metric"]), means["change"])
    return done(fig, axes, ax)
'''
SVG_MODULE = '''"""A test's SVG twin of mean_change."""
from attnprobe.report.charts import heatmap, number
from attnprobe.report.figure_svg import svg_renderer

RANK = 95


@svg_renderer("mean_change")
def render(means):
    values = means["change"].to_numpy(dtype=float)[None, :]
    tips = [[f"{m}: mean change {number(v)}" for m, v in zip(means["metric"], means["change"])]]
    return [heatmap(values, ["mean"], list(means["metric"]), tips, caption="mean change")]
'''
SECTION_MODULE = '''"""A test's section: the mean change per metric of a perturbation run."""
from attnprobe.report import sections
from attnprobe.report.contents import as_frame, section
from attnprobe.report.figure_svg import svg_figures
from attnprobe.report.sections import Section

RANK = 95


@section("mean-change", rank=65, applies=lambda c: c.perturbation is not None,
         shows="a perturbation run: mean change per metric (a test's)")
def render(contents):
    figures = svg_figures("mean_change", as_frame(contents.perturbation, "perturbation"))
    return [Section("mean-change", "Mean change", sections.result("Per metric.", figures, None))]
'''


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    for package, folder, text in ((plot_package, "plot", FIGURE_MODULE),
                                  (svg_package, "svg", SVG_MODULE),
                                  (section_package, "sections", SECTION_MODULE)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"{MODULE}.py").write_text(text)
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path / folder)])
    importlib.invalidate_caches()
    yield
    for registry, name in ((FIGURES, NAME), (SVG_RENDERERS, NAME), (SECTIONS, SECTION)):
        if name in registry:
            registry.unregister(name)
    for package in (plot_package, svg_package, section_package):
        sys.modules.pop(f"{package.__name__}.{MODULE}", None)
        if hasattr(package, MODULE):  # the import system set it on the package
            delattr(package, MODULE)


# by construction: tvd rows 0.1 and 0.3 (mean 0.2), one jsd row 0.5
RUN = pd.DataFrame({"experiment": "ablate", "scope": ["head:0.1", "head:1.0", "head:0.1"],
                    "example_id": "0", "metric": ["tvd", "tvd", "jsd"], "baseline": 0.0,
                    "perturbed": [0.1, 0.3, 0.5], "change": [0.1, 0.3, 0.5]})


def test_a_new_figure_and_section_are_modules_discovered_everywhere(throwaway):
    assert NAME not in FIGURES and SECTION not in SECTIONS  # only discovery registers them
    registered_figures()
    assert NAME in FIGURES and NAME in dir(ap.plot)
    fig = ap.plot.mean_change(RUN)
    heights = [bar.get_height() for bar in fig.axes[0].patches]
    np.testing.assert_allclose(heights, [0.2, 0.5], rtol=4 * np.finfo(float).eps)

    html = ap.report.build(perturbation=RUN).html
    ids = [part.split('"')[0] for part in html.split('<section id="sec-')[1:]]
    assert ids.index("mean-change") == ids.index("perturbation") + 1  # rank 65: after 60
    shown = html[html.index('<section id="sec-mean-change">'):]
    shown = shown[:shown.index("</section>")]
    assert "tvd: mean change 0.2<" in shown and "jsd: mean change 0.5<" in shown

    readme = render_readme(README.read_text(encoding="utf-8"))
    assert ("| `ap.plot.mean_change` | mean change per metric (a test's) | `perturb.run` table "
            "| `mean_change_table` | SVG |") in readme
    assert "| `mean-change` | 65 | a perturbation run: mean change per metric (a test's) |" \
        in readme


def test_the_throwaway_extension_is_gone_after_the_test():
    assert NAME not in FIGURES and NAME not in SVG_RENDERERS and SECTION not in SECTIONS
    assert NAME not in dir(ap.plot)
