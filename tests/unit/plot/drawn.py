"""Read back what a figure drew: heatmap cells, images, bars, lines, points, tick labels."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PathCollection, QuadMesh
from matplotlib.colors import to_rgb
from matplotlib.image import AxesImage


def render(fig: Any, fmt: str = "png") -> bytes:
    """Draw the figure with Agg (and write it as ``fmt``): layout and text must work."""
    FigureCanvasAgg(fig).draw()
    out = io.BytesIO()
    fig.savefig(out, format=fmt)
    return out.getvalue()


def mesh(ax: Any) -> np.ndarray:
    """The cell values of the one heatmap on ``ax`` (NaN where masked)."""
    meshes = [c for c in ax.collections if isinstance(c, QuadMesh)]
    assert len(meshes) == 1
    values = meshes[0].get_array()
    return np.ma.filled(np.ma.asarray(values, dtype=float), np.nan)


def image(ax: Any) -> np.ndarray:
    images = [c for c in ax.get_images() if isinstance(c, AxesImage)]
    assert len(images) == 1
    return np.asarray(images[0].get_array())


def ticks(ax: Any, axis: str = "x") -> list[str]:
    labels = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    return [t.get_text() for t in labels]


def points(ax: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(xy, rgb)`` of every scatter point on ``ax``."""
    xy, rgb = [], []
    for collection in ax.collections:
        if isinstance(collection, PathCollection):
            xy.append(collection.get_offsets())
            rgb.append(collection.get_facecolors()[:, :3])
    return np.vstack(xy), np.vstack(rgb)


def rgb(colour: str) -> tuple[float, float, float]:
    return to_rgb(colour)
