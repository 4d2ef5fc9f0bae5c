"""The layer profile as SVG (the twin of :func:`attnprobe.plot.layer_profile`): label shares
per layer as stacked bars."""

from __future__ import annotations

from typing import Any

import pandas as pd

from attnprobe.heads import labels as label_rules
from attnprobe.report import svg
from attnprobe.report.figure_svg import svg_renderer

RANK = 21


@svg_renderer("layer_profile")
def render(classified: pd.DataFrame) -> list[Any]:
    """The bars of a classified table's label shares per layer."""
    return [svg.layer_profile_chart(label_rules.layer_profile(classified))]
