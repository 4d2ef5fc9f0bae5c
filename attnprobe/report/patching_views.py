"""The notebook view of a patching table (``ap.patch.heads`` / ``path`` / ``attribution``),
registered as ``patching`` in :data:`attnprobe.core.html_view.RENDERERS` (imported by
:mod:`attnprobe.report.views`), and the report's patching section.

The view: the mean normalised effect per patch (layer × head, or heads × position for
``positions="each"``) with a tooltip per cell, the notes (examples whose clean and corrupted
metric are equal), the per-patch summary collapsed (:func:`patching_body`: the report's
section), and the whole table.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from attnprobe.core.html_view import RENDERERS
from attnprobe.plot.patching import patch_means
from attnprobe.report import sections
from attnprobe.report.figure_svg import svg_of
from attnprobe.report.notebook import fragment

__all__ = ["patching_body", "patching_html"]


def patching_body(table: pd.DataFrame, of: int | None = None) -> Any:
    """A patching table: the mean effect per patch (a figure per experiment, site,
    direction and metric), the notes, the per-patch summary (collapsed). ``of``: the corpus
    the pairs were taken from (said)."""
    frame = pd.DataFrame(table)
    means = patch_means(frame)  # the figure's data, computed once for figure and table
    figures, notes = svg_of("patching_effect")(means), list(table.attrs.get("notes", []))
    n = frame["example_id"].nunique()
    corpus = f" (the first {n} of {of} texts, each with its corrupted input)" \
        if of is not None and of > n else ""
    note = (f"{n} example pair(s){corpus}; effect = "
            "(patched − corrupt)/(clean − corrupt) when denoising, "
            "(clean − patched)/(clean − corrupt) when noising.")
    if notes:
        note += " " + " ".join(notes)
    return sections.result(note, figures, means, "mean per patch")


@RENDERERS.register("patching")
def patching_html(table: pd.DataFrame) -> str:
    """A patching table: :func:`patching_body`, then the table itself."""
    return fragment(patching_body(table) + sections.table(pd.DataFrame(table), max_rows=200))
