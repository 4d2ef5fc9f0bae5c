"""The one Jinja2 environment of the reports: package templates, autoescaping always on.

Every ``{{ value }}`` in a template is HTML-escaped (attributes included: quotes are escaped
too) and has its bidirectional control characters shown (see :mod:`attnprobe.report.text`).
Only three kinds of text are marked safe, each by the code that makes it: a
rendered template, the escaped JSON of :func:`attnprobe.report.data.escape_json`, and our own
static CSS/JS read by :func:`asset`.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

from attnprobe.core.optional import require
from attnprobe.report.text import show_controls

PACKAGE = "attnprobe.report"
# A static file inlined into <style>/<script> must not be able to end that element early.
_CLOSERS = ("</script", "</style", "<!--")


def _finalize(value: Any) -> Any:
    """Applied to every ``{{ }}`` value before escaping; safe markup passes untouched."""
    if isinstance(value, str) and not hasattr(value, "__html__"):
        return show_controls(value)
    return value


def _px(value: float) -> str:
    """A coordinate with one decimal (keeps the SVG small and deterministic)."""
    return f"{float(value):.1f}"


@functools.lru_cache(maxsize=1)
def environment() -> Any:
    """The shared ``jinja2.Environment`` (MissingExtraError naming ``report`` without jinja2)."""
    jinja2 = require("jinja2")
    env = jinja2.Environment(
        loader=jinja2.PackageLoader(PACKAGE, "templates"),
        autoescape=True,  # every template, whatever its suffix
        undefined=jinja2.StrictUndefined,  # a misspelt variable is an error, not ""
        finalize=_finalize, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)
    env.filters["px"] = _px
    return env


def markup(text: str) -> Any:
    """``text`` marked safe: only for text this package escaped or wrote itself."""
    return require("markupsafe").Markup(text)  # a dependency of jinja2


def render(template: str, **context: Any) -> Any:
    """``template`` rendered with ``context``, as markup (safe to place in another template)."""
    return markup(environment().get_template(template).render(**context).strip())


@functools.cache
def asset(name: str) -> Any:
    """The static file ``static/<name>`` as markup to inline in ``<style>`` or ``<script>``."""
    text = resources.files(PACKAGE).joinpath("static", name).read_text(encoding="utf-8")
    for closer in _CLOSERS:
        if closer in text.lower():
            raise RuntimeError(f"static/{name} contains {closer!r}; it could not be inlined")
    environment()  # the report extra is there
    return markup(text.strip())
