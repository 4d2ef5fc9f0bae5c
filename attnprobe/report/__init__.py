"""Self-contained HTML reports: ``attnprobe.report.build(...).save("report.html")``.

Imported on use (never by ``import attnprobe``). Pages are rendered from the Jinja2 templates
in ``templates/`` (autoescaping on) with the CSS/JS in ``static/`` inlined; building one needs
the ``report`` extra (jinja2), the BertViz export does not.
"""

from attnprobe.report.bertviz import bertviz_json, save_bertviz, to_bertviz
from attnprobe.report.from_files import report_from_maps
from attnprobe.report.page import Report, build

__all__ = ["Report", "bertviz_json", "build", "report_from_maps", "save_bertviz", "to_bertviz"]
