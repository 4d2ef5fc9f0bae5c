"""Build one self-contained HTML report: all CSS/JS inlined, no URL to any other host.

A page shows :class:`~attnprobe.report.contents.Contents` (the analysis results it is given):
every registered section kind (:data:`~attnprobe.report.contents.SECTIONS`, in rank order)
that applies to them renders itself — model card (from ``maps[0].info`` or ``info``), head
grid / layer profile / head clusters (``census``), interactive attention view with the model
view and head panels (``maps``), syntax table, attribution comparison, perturbation results,
checkpoint diff, the caller's own tables, direct logit attribution, composition scores and
patching effects. Results are drawn as inline SVG figures
(:mod:`.result_figures`) with their tables collapsed, and each section names its corpus size. The
page is rendered from Jinja2 templates with autoescaping on (:mod:`.templating`): every token,
cell, heading, key and title is escaped, attributes included; ids are slugs; the maps travel as
escaped JSON (:mod:`.data`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from attnprobe.core import html_view
from attnprobe.core.display import counted, describe, quoted, size
from attnprobe.core.files import atomic_write
from attnprobe.errors import InputError
from attnprobe.report import data
from attnprobe.report.contents import MAPS_ID, Contents, page_sections
from attnprobe.report.templating import asset, markup, render
from attnprobe.types import AttentionMap

__all__ = ["CONTENTS_FIELDS", "MAPS_ID", "Report", "build"]

CONTENTS_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Contents))


@dataclass(frozen=True)
class Report:
    """A rendered report.

    Attributes:
        html: the page.
        title: its title.
        contents: the analysis results it shows (:class:`~attnprobe.report.contents.Contents`:
            ``maps``, ``census``, ``comparison``, ...), e.g. to read the census table after
            :func:`~attnprobe.report.from_model`; empty for a page made from HTML alone.
    """

    html: str
    title: str = "attnprobe report"
    contents: Contents = field(default_factory=Contents, repr=False, compare=False)

    @property
    def size_bytes(self) -> int:
        return len(self.html.encode("utf-8"))

    def __repr__(self) -> str:
        return describe("Report", quoted(self.title, 60), size(self.size_bytes),
                        counted(self.html.count("<section id="), "section"))

    def _repr_html_(self) -> str | None:
        """The page in a notebook, inside a sandboxed ``<iframe srcdoc>`` (its script and
        styles stay inside it)."""
        return html_view.html(self, "report")

    def save(self, path: str | Path) -> Path:
        """Write the page to ``path`` atomically (a killed save leaves the old file or none)."""
        return atomic_write(path, lambda tmp: tmp.write_text(self.html, encoding="utf-8"))


def build(contents: Contents | None = None, *, title: str = "attnprobe report",
          **results: Any) -> Report:
    """Render the report: every registered section
    (:data:`~attnprobe.report.contents.SECTIONS`) that applies to what is given, in rank order.

    Args:
        contents: the results as one :class:`~attnprobe.report.contents.Contents` (what
            ``Report.contents`` holds); ``results`` replace its fields.
        title: the page title.
        results: the results by name (the fields of ``Contents``, below); an unknown name
            is an InputError naming them.

    Results by name:
        maps: attention maps for the interactive views (one per sentence): the head view,
            the model view (every head as a thumbnail; a click opens it) and, with a
            census, the head panel (label, evidence, ``also``, scores) of the head clicked.
        census: a ``Census`` (classify / layer profile / clusters when distances exist) or a
            classified (or score) DataFrame.
        syntax: ``Census.syntax()``-shaped table; relations with fewer than ``min_count``
            words are left out (the page says how many).
        comparison: an attribution ``Comparison`` (agreement by layer and token heat
            figures) or its summary DataFrame.
        perturbation: a perturbation ``run()`` DataFrame (effect per head figure).
        diff: a checkpoint ``Diff`` (``ap.heads.diff``): change per head and per layer.
        info: model info for the card when there are no maps (else ``maps[0].info``).
        tables: more sections, ``(key, heading, table)`` each, with id ``sec-<slug of key>``
            (lower case; runs of characters other than ``a-z0-9_-`` become ``-``); empty or
            missing tables are left out.
        min_count: the fewest words a syntax relation needs to be listed (default 20, as
            the labels use).
        logit_attribution: a ``LogitAttribution`` (``ap.heads.logit_attribution``): each
            head's mean direct part (layer × head), the top heads, every component.
        composition: a ``Composition`` (``ap.heads.composition``): writer × reader over the
            random baseline per kind, the strongest pairs.
        patching: a patching table (``ap.patch.heads`` / ``path`` / ``attribution``): the
            mean effect per patch, the per-patch summary.
        faithfulness: a ``Faithfulness`` (``ap.faithfulness.evaluate``): the ranked summary
            with confidence intervals, the deletion curves and the ranking.

    Returns:
        :class:`Report` with the HTML text. Every section says how many sentences it was
        computed on; figures are inline SVG with the raw tables collapsed under them.

    Raises:
        InputError: nothing to report, maps that are not AttentionMaps, a table that is not
            a DataFrame, or two sections with the same id.
        MissingExtraError: jinja2 (the ``report`` extra) is not installed.

    Example:
        >>> import re
        >>> every = ap.heads.syntax(maps, trees, min_count=1)   # every relation, however rare
        >>> page = build(maps=maps, syntax=every, min_count=1)
        >>> re.findall(r'<section id="([^"]+)"', page.html)   # what the results allow
        ['sec-model', 'sec-attention', 'sec-syntax']
        >>> "https://" in page.html, "http://" in page.html   # one file, nothing fetched
        (False, False)
        >>> page.save("report.html")
        PosixPath('report.html')
    """
    unknown = sorted(set(results) - set(CONTENTS_FIELDS))
    if unknown:
        raise InputError(f"build() takes no result {unknown[0]!r}; the results are "
                         f"{', '.join(CONTENTS_FIELDS)}")
    if isinstance(results.get("maps"), AttentionMap):
        results["maps"] = [results["maps"]]
    for name in ("maps", "tables"):  # any sequence, kept as a tuple
        if name in results:
            results[name] = tuple(results[name] or ())
    contents = replace(contents, **results) if contents is not None else Contents(**results)
    if contents.empty:
        raise InputError("nothing to report: pass maps, census, syntax, comparison, "
                         "perturbation, diff, logit_attribution, composition, patching or "
                         "faithfulness")
    maps = list(contents.maps)
    html = render("page.html.j2", title=str(title), sections=page_sections(contents),
                  css=asset("report.css") + "\n" + asset("views.css"),
                  maps_id=MAPS_ID, js=asset("attention_view.js") if maps else "",
                  maps_json=markup(data.escape_json(data.pack_maps(maps))) if maps else "")
    return Report(html=str(html), title=str(title), contents=contents)
