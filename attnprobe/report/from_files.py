"""Reports from saved files, without the model: maps written by ``ap.save_maps`` /
``attnprobe extract --out maps.npz`` go back into a page."""

from __future__ import annotations

from pathlib import Path

from attnprobe.report.page import Report, build
from attnprobe.types import load_maps


def report_from_maps(path: str | Path, title: str | None = None) -> Report:
    """Load the maps saved at ``path`` (``.npz`` plus ``.json`` sidecar) and build a report with
    the model card and the interactive attention view."""
    maps = load_maps(path)
    return build(maps=maps, title=title or f"attnprobe report: {Path(path).name}")
