"""Reports from saved files, without the model: maps written by ``ap.save_maps`` /
``attnprobe extract --out maps.npz`` go back into a page."""

from __future__ import annotations

from pathlib import Path

from attnprobe.report.page import Report, build
from attnprobe.types import load_maps


def report_from_maps(path: str | Path, title: str | None = None) -> Report:
    """Load the maps saved at ``path`` (``.npz`` plus ``.json`` sidecar) and build a report with
    the model card and the interactive attention view.

    Example:
        >>> _ = ap.save_maps(maps, "saved")             # e.g. attnprobe extract --out saved.npz
        >>> page = report_from_maps("saved")            # no model needed
        >>> page.title, 'id="sec-attention"' in page.html
        ('attnprobe report: saved', True)
        >>> page.save("report.html")
        PosixPath('report.html')
    """
    maps = load_maps(path)
    return build(maps=maps, title=title or f"attnprobe report: {Path(path).name}")
