"""mkdocs hook: the guide pages take their text from the README's marked spans, so the guide
has no copy of the README to drift from it.

The README marks a span with two invisible comments (on lines of their own)::

    <!-- docs:census:start -->
    ## Head census: what does every head do?
    ...
    <!-- docs:census:end -->

and a guide page includes it with a line of its own::

    <!-- docs:include census -->

Rules (an error stops the build; a warning stops it under ``mkdocs build --strict``, which
``make docs`` and CI use):

- every start has its end, spans do not nest or overlap, and a name is marked once (error);
- a page that includes a name the README does not mark is an error — except
  ``<!-- docs:include NAME optional -->``, the one documented way to name a section that has
  not landed yet: it renders a note saying so until the README marks ``NAME``;
- every span is included by some page, and every ``## `` section of the README lies inside a
  span (warning): a new README section shows up in the site, or the build names it.

Docstring faults that only an edit under ``attnprobe/`` can fix are listed in
:data:`KNOWN_DOCSTRING_FAULTS`: Griffe's warning for each is shown at INFO level (so the
strict build passes while they wait for the docstring pass), and an entry that no longer
matches is a warning, so the list only shrinks.

Links in the README are relative to the repository (``analyses/tour.ipynb``), where the site
has no page, so an included span shows such a link as its text (the path); a link to a page
under ``docs/`` (``docs/guide/causal-methods.md#activation-patching``) stays a link, made
relative to the page that includes the span. A Pygments
stylesheet for the code blocks is written into the site (no CDN), and a built page with an
element that loads from another host (``<script src="https://...">``, a CDN font ...) is a
warning: the site works offline. Plain links to other sites (the theme's footer) are fine.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

log = logging.getLogger("mkdocs.hooks.readme_spans")

MARK = re.compile(r"^\s*<!--\s*docs:([\w-]+):(start|end)\s*-->\s*$")
INCLUDE = re.compile(r"^\s*<!--\s*docs:include\s+([\w-]+)(\s+optional)?\s*-->\s*$")
# [text](target) where target has no scheme and is no in-page anchor: a repository path
RELATIVE_LINK = re.compile(r"\[([^\]\n]+)\]\((?![a-z][a-z0-9+.-]*:|#)([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
# an element that makes the browser load something from another host
EXTERNAL_LOAD = re.compile(r"<(?:script|link|img|iframe|source|embed|object)\b[^>]*?"
                           r"\b(?:src|href|data)=[\"'](?:https?:)?//[^\"']*", re.I)

# (file, part of Griffe's message): docstrings to fix in attnprobe/, then delete the entry
KNOWN_DOCSTRING_FAULTS: tuple[tuple[str, str], ...] = ()

_spans: dict[str, str] = {}
_included: set[str] = set()
_faults_seen: set[tuple[str, str]] = set()


class _KnownFaults(logging.Filter):
    """Shows Griffe's warnings about :data:`KNOWN_DOCSTRING_FAULTS` at INFO level."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        for fault in KNOWN_DOCSTRING_FAULTS:
            found = fault[0] in message and fault[1].lower() in message.lower()
            if record.levelno == logging.WARNING and found:
                _faults_seen.add(fault)
                record.levelno, record.levelname = logging.INFO, "INFO"
                record.msg, record.args = f"known docstring fault (to fix): {message}", ()
        return True


_filter = _KnownFaults()


def read_spans(text: str) -> dict[str, str]:
    """The README's marked spans by name; PluginError on a malformed marker layout."""
    spans: dict[str, str] = {}
    open_name, open_line, body = None, 0, []
    for number, line in enumerate(text.splitlines(), start=1):
        found = MARK.match(line)
        if not found:
            if open_name is not None:
                body.append(line)
            continue
        name, edge = found.groups()
        if edge == "start":
            if open_name is not None:
                raise PluginError(f"README.md:{number}: docs:{name}:start inside the span "
                                  f"{open_name!r} opened on line {open_line}; spans do not nest")
            if name in spans:
                raise PluginError(f"README.md:{number}: the span {name!r} is marked twice")
            open_name, open_line, body = name, number, []
        elif name != open_name:
            raise PluginError(f"README.md:{number}: docs:{name}:end without its start "
                              f"(open span: {open_name!r})")
        else:
            spans[name] = "\n".join(body).strip("\n") + "\n"
            open_name = None
    if open_name is not None:
        raise PluginError(f"README.md:{open_line}: the span {open_name!r} has no end marker")
    return spans


def unmarked_sections(text: str) -> list[str]:
    """The README's ``## `` headings that no span holds (fenced code is skipped)."""
    outside, inside_span, fenced = [], False, False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        found = MARK.match(line)
        if found:
            inside_span = found.group(2) == "start"
        elif line.startswith("## ") and not fenced and not inside_span:
            outside.append(line[3:].strip())
    return outside


def unlink_paths(span: str, page: str = "index.md") -> str:
    """The span with repository-relative links shown as their text, except links to pages
    under ``docs/``, made relative to ``page`` (its path under ``docs/``); fenced code is
    untouched."""
    def link(found: re.Match) -> str:
        text, target = found.groups()
        if not target.startswith("docs/"):
            return text
        here = posixpath.dirname(page) or "."
        return f"[{text}]({posixpath.relpath(target[len('docs/'):], here)})"

    lines, fenced = [], False
    for line in span.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        lines.append(line if fenced else RELATIVE_LINK.sub(link, line))
    return "\n".join(lines) + "\n"


def on_config(config: Any) -> Any:
    readme = Path(config["config_file_path"]).parent / "README.md"
    text = readme.read_text(encoding="utf-8")
    _spans.clear()
    _spans.update(read_spans(text))
    _included.clear()
    _faults_seen.clear()
    griffe_log = logging.getLogger("mkdocs.plugins.griffe")
    if _filter not in griffe_log.filters:
        griffe_log.addFilter(_filter)
    for heading in unmarked_sections(text):
        log.warning(f"README.md: the section {heading!r} is in no docs span; mark it with "
                    "<!-- docs:NAME:start --> / <!-- docs:NAME:end --> and include it in a "
                    "page under docs/guide/ (<!-- docs:include NAME -->)")
    return config


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    out = []
    for line in markdown.splitlines():
        found = INCLUDE.match(line)
        if not found:
            out.append(line)
            continue
        name, optional = found.group(1), bool(found.group(2))
        _included.add(name)
        if name in _spans:
            out.append(unlink_paths(_spans[name], page.file.src_uri))
        elif optional:
            out.append(f"!!! note\n    The README has no `{name}` section yet; this page will "
                       "include it once the README marks it.\n")
        else:
            raise PluginError(f"{page.file.src_uri}: includes the README span {name!r}, which "
                              f"README.md does not mark (it marks: {', '.join(sorted(_spans))})")
    return "\n".join(out) + "\n"


def on_post_build(config: Any) -> None:
    for name in sorted(set(_spans) - _included):
        log.warning(f"README.md: the span {name!r} is included by no page under docs/")
    for path, text in sorted(set(KNOWN_DOCSTRING_FAULTS) - _faults_seen):
        log.warning(f"docs/hooks.py: KNOWN_DOCSTRING_FAULTS lists {path} ({text!r}), which "
                    "Griffe no longer reports: delete the entry")
    from pygments.formatters import HtmlFormatter

    site = Path(config["site_dir"])
    css = site / "css" / "pygments.css"
    css.parent.mkdir(parents=True, exist_ok=True)
    css.write_text(HtmlFormatter(style="default").get_style_defs(".highlight"), encoding="utf-8")
    for page in sorted(site.rglob("*.html")):
        for found in EXTERNAL_LOAD.findall(page.read_text(encoding="utf-8")):
            log.warning(f"{page.relative_to(site)}: loads from the network ({found[:120]}); "
                        "the site must work offline")
