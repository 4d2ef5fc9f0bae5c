"""The head grid as SVG (the twin of :func:`attnprobe.plot.head_grid`): layer × head cells
coloured by label, the legend grouped by family."""

from __future__ import annotations

from typing import Any

import pandas as pd

from attnprobe.report import svg
from attnprobe.report.figure_svg import svg_renderer

RANK = 20


@svg_renderer("head_grid")
def render(classified: pd.DataFrame) -> list[Any]:
    """The grid of a classified table (one row per head with its ``label``)."""
    return [svg.head_grid(classified)]
