"""Notebook HTML: the one seam through which result objects on every floor get an HTML view.

Result classes live on low floors (``AttentionMap`` in ``types``, ``Census`` and ``Diff`` in
``heads``, ``Comparison`` in ``attribution``, the perturbation table in ``perturb``); their
HTML is drawn by the report floor (:mod:`attnprobe.report.views`). A floor must not import
a higher one, so the dependency is inverted here: each class's ``_repr_html_`` is one line,
``return html_view.html(self, "<kind>")``, and the report floor registers one renderer per
kind in :data:`RENDERERS`. Like an optional dependency
(:func:`~attnprobe.core.optional.require`), the provider module :data:`PROVIDER` is imported
the first time a view is asked for, so ``import attnprobe`` stays light (no jinja2) and no
floor imports upward. A new view is one ``@RENDERERS.register("kind")`` function in the
provider and one ``_repr_html_`` line on the class.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from attnprobe.core.optional import require
from attnprobe.core.registry import Registry
from attnprobe.errors import MissingExtraError

__all__ = ["PROVIDER", "RENDERERS", "attach", "html"]

RENDERERS: Registry[Callable[[Any], str]] = Registry("notebook view")
"""kind -> function(object) -> a self-contained HTML fragment."""
PROVIDER = "attnprobe.report.views"  # registers every renderer when imported


def html(obj: Any, kind: str) -> str | None:
    """The HTML view of ``obj`` drawn by the renderer registered for ``kind``.

    Returns ``None`` (a notebook then shows the text ``repr``) when the ``report`` extra
    (jinja2) is not installed; any other error propagates.
    """
    try:
        if kind not in RENDERERS:
            require(PROVIDER)
        return RENDERERS.get(kind)(obj)
    except MissingExtraError:
        return None


def attach(obj: Any, kind: str) -> Any:
    """``obj`` with an instance ``_repr_html_`` that draws it as ``kind``, for objects whose
    class is not ours: a perturbation table stays exactly a ``pandas.DataFrame`` (frames
    derived from it are plain ones, with pandas' own table). Returns ``obj``."""
    obj._repr_html_ = types.MethodType(lambda self: html(self, kind), obj)
    return obj
