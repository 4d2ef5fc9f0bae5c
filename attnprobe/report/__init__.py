"""Self-contained HTML reports: ``attnprobe.report.build(...).save("report.html")``.

Imported on use (never by ``import attnprobe``); needs only numpy and pandas.
"""

from attnprobe.report.build import Report, build

__all__ = ["Report", "build"]
