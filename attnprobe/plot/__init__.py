"""Figures from result objects and tidy tables (seaborn + matplotlib; the ``report`` extra).

Every function takes a result object or the tidy table it gives, draws into a new matplotlib
``Figure`` (or into ``ax=`` and returns that Axes), and never shows it, opens a pyplot window
or changes global matplotlib state; save it with ``fig.savefig("heads.svg")``. matplotlib and
seaborn are imported on first use (a missing extra is an error naming ``attnprobe[report]``).

Every figure is one :class:`~attnprobe.plot.figure.Figure` of :data:`FIGURES`: a data
function giving the tidy table it draws, its matplotlib renderer (the function here) and,
when the report shows it, an SVG renderer of the same table. The modules of this package
are discovered, so a new figure is one module here. The list of figures is the registry's:
the README's figure table (``make readme``) and, at run time, the table below
(``help(attnprobe.plot)``).
"""

from typing import Any

from attnprobe.plot.figure import FIGURES, Figure, figure_table, registered_figures

_FOUND = registered_figures()
globals().update({found.name: found.draw for found in _FOUND})
__doc__ = f"{__doc__}\n{figure_table()}\n"

__all__ = ["FIGURES", "Figure", *sorted(found.name for found in _FOUND)]


def __dir__() -> list[str]:
    return sorted({*globals(), *FIGURES.names()})


def __getattr__(name: str) -> Any:
    # a figure registered after this import (a plugin module) is ap.plot.<name> too
    if name in FIGURES:
        return FIGURES.get(name).draw
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
