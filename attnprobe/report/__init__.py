"""Self-contained HTML reports: ``attnprobe.report.build(...).save("report.html")``, or the
whole analysis from a model: ``attnprobe.report.from_model(model, tok, texts)``.

Imported on use (never by ``import attnprobe``). Pages are rendered from the Jinja2 templates
in ``templates/`` (autoescaping on) with the CSS/JS in ``static/`` inlined; building one needs
the ``report`` extra (jinja2), the BertViz export does not. The sections a page can show are
registered in :data:`SECTIONS` (:mod:`attnprobe.report.contents`), one module each in
:mod:`attnprobe.report.section_kinds`, discovered on import.
"""

from attnprobe.report.bertviz import bertviz_json, save_bertviz, to_bertviz
from attnprobe.report.contents import (
    SECTIONS,
    Contents,
    SectionKind,
    registered_sections,
    section,
)
from attnprobe.report.from_files import report_from_maps
from attnprobe.report.page import Report, build
from attnprobe.report.pipeline import from_model

__all__ = ["SECTIONS", "Contents", "Report", "SectionKind", "bertviz_json", "build",
           "from_model", "report_from_maps", "save_bertviz", "section", "to_bertviz"]

registered_sections()  # the built-in sections register: SECTIONS is complete once imported
