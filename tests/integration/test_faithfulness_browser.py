"""The faithfulness section and the notebook view of a ``Faithfulness`` in a real browser:
headless Chromium opens them from disk, nothing logs an error or is fetched, the section and
its two figures are drawn, and the table shows the summary's numbers. Skipped where Chromium
is absent, as the other report browser tests."""

from __future__ import annotations

import json

import pytest

import attnprobe as ap
from tests.integration.test_report_browser import (  # noqa: F401 - the fixture
    CHROMIUM,
    DRIVER,
    browser,
)
from tests.unit.faithfulness import synthetic

pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                reason="Chromium or ChromeDriver not installed (Debian "
                                       "packages chromium and chromium-driver)")

METRICS = ("aopc_comprehensiveness", "aopc_sufficiency", "abpc", "tau_loo")


def _g(value: float) -> str:
    return f"{value:.4g}"


def _clean_load(driver) -> None:
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    requests = [json.loads(e["message"])["message"] for e in driver.get_log("performance")]
    fetched = [m["params"]["request"]["url"] for m in requests
               if m["method"] == "Network.requestWillBeSent"]
    assert all(url.startswith(("file:", "data:")) for url in fetched), fetched


def _check_shown(root, found) -> None:
    """The ranked table (hand means, the summary's intervals) and both figures, drawn."""
    summary = found.summary().set_index("source")
    rows = [[td.text for td in tr.find_elements("css selector", "td")]
            for tr in root.find_elements("css selector", "table.ap-table tbody tr")]
    assert [r[1] for r in rows[:3]] == ["saliency", "raw@L1", "random"]
    for row in rows[:3]:
        for metric, cell in zip(METRICS, row[4:8], strict=True):
            low, high = summary.loc[row[1], [f"{metric}_low", f"{metric}_high"]]
            assert cell == (f"{_g(synthetic.mean_of(row[1], metric))} "
                            f"[{_g(low)}, {_g(high)}]")
    for kind in ("faithfulness-curves", "faithfulness-ranking"):
        figure = root.find_element("css selector", f"svg.{kind}")
        assert figure.is_displayed() and figure.rect["width"] > 100
    dots = root.find_elements("css selector", "svg.faithfulness-ranking g.ap-dot")
    assert [d.get_attribute("data-source") for d in dots] == ["saliency", "raw@L1"]
    series = root.find_elements("css selector", "svg.faithfulness-curves g.ap-series")
    assert len(series) == 2 * len(synthetic.KINDS)  # MoRF and LeRF per source


def test_the_report_section_in_a_browser(browser, tmp_path):  # noqa: F811
    found = synthetic.result()
    page = ap.report.build(faithfulness=found).save(tmp_path / "faithfulness.html")
    browser.get(page.as_uri())
    section = browser.find_element("css selector", "#sec-faithfulness")
    assert section.find_element("css selector", "h2").text == "Faithfulness"
    _check_shown(section, found)
    _clean_load(browser)


def test_the_notebook_view_in_a_browser(browser, tmp_path):  # noqa: F811
    found = synthetic.result()
    notebook = tmp_path / "notebook.html"
    notebook.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
                        + found._repr_html_() + "</body></html>", encoding="utf-8")
    browser.get(notebook.as_uri())
    _check_shown(browser.find_element("css selector", "body"), found)
    _clean_load(browser)
