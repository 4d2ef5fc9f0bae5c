"""Self-contained HTML reports: ``attnprobe.report.build(...).save("report.html")``.

Imported on use (never by ``import attnprobe``); needs only numpy and pandas.
"""

from attnprobe.report.bertviz import bertviz_json, save_bertviz, to_bertviz
from attnprobe.report.from_files import report_from_maps
from attnprobe.report.page import Report, build

__all__ = ["Report", "bertviz_json", "build", "report_from_maps", "save_bertviz", "to_bertviz"]
