"""The report in a real browser: headless Chromium opens it from disk, nothing is fetched,
nothing logs an error, an injected token runs nothing, and the attention view follows the
head selector and the mouse. Skipped (with the reason) only where Chromium is absent;
``.ci/run`` installs the Debian packages ``chromium`` and ``chromium-driver``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

import attnprobe as ap
from attnprobe.types import AttentionMap, ModelInfo

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the dev extra) missing")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                reason="Chromium or ChromeDriver not installed (Debian "
                                       "packages chromium and chromium-driver)")
TOKENS = ("[CLS]", "the", "<script>alert(1)</script>", "cat", "sat", "[SEP]")


def _report(tmp_path: Path) -> Path:
    """Head 0 attends each token to itself, head 1 uniformly to all 6."""
    n = len(TOKENS)
    pattern = torch.stack([torch.eye(n), torch.full((n, n), 1 / n)])[None]  # [1, 2, n, n]
    info = ModelInfo(name="toy", arch="toy", n_layers=1, n_heads=2, causal=False)
    amap = AttentionMap(pattern=pattern, query_tokens=TOKENS, key_tokens=TOKENS, layers=(0,),
                        info=info, example_id="<b>x</b>")
    return ap.report.build(maps=[amap], title="<i>report</i>").save(tmp_path / "report.html")


@pytest.fixture
def browser():
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--window-size=1200,900"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _lines(driver) -> int:
    return len(driver.find_elements("css selector", "#ap-view svg.lines line"))


def test_report_opens_offline_and_the_view_reacts(browser, tmp_path):
    import json

    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import Select

    page = _report(tmp_path)
    browser.get(page.as_uri())
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018 - the injected token must not have run
    assert browser.title == "<i>report</i>"  # shown as text
    tokens = [t.text for t in browser.find_elements("css selector", "#ap-view .left .tok")]
    assert tokens == list(TOKENS)

    n = len(TOKENS)
    assert _lines(browser) == n  # head 0: one line per token, to itself
    Select(browser.find_element("css selector", ".sel-head")).select_by_index(1)
    assert _lines(browser) == n * n  # head 1: every pair at 1/6
    ActionChains(browser).move_to_element(
        browser.find_elements("css selector", "#ap-view .left .tok")[3]).perform()
    assert _lines(browser) == n  # hovering a query shows only its row
    shot = tmp_path / "report.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 1000

    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    requests = [json.loads(e["message"])["message"] for e in browser.get_log("performance")]
    fetched = [m["params"]["request"]["url"] for m in requests
               if m["method"] == "Network.requestWillBeSent"]
    assert fetched and all(url.startswith(("file:", "data:")) for url in fetched), fetched


EVIL_KEY = 'x"><script>alert(1)</script>'
# Right-to-left words around a number, and a token holding RIGHT-TO-LEFT OVERRIDE: unisolated,
# the number would join the Hebrew run (the three tokens drawn in reverse order) and U+202E
# would reverse every token after it on the line.
BIDI_TOKENS = ("[CLS]", "שלום", "1", "עולם", "\u202eevil", "cat", "[SEP]")


def _hostile_report(tmp_path: Path) -> Path:
    n = len(BIDI_TOKENS)
    info = ModelInfo(name="toy\u202e", arch="toy", n_layers=1, n_heads=1, causal=False)
    amap = AttentionMap(pattern=torch.full((1, 1, n, n), 1 / n), query_tokens=BIDI_TOKENS,
                        key_tokens=BIDI_TOKENS, layers=(0,), info=info)
    table = pd.DataFrame({EVIL_KEY: [EVIL_KEY], "b": ["\u202eright"]})
    page = ap.report.build(maps=[amap], tables=[(EVIL_KEY, EVIL_KEY, table)], title=EVIL_KEY)
    return page.save(tmp_path / "hostile.html")


def test_hostile_keys_run_nothing_and_tokens_are_isolated(browser, tmp_path):
    from selenium.common.exceptions import NoAlertPresentException

    browser.get(_hostile_report(tmp_path).as_uri())
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018 - neither the key nor the cell ran
    assert browser.execute_script("return document.scripts.length") == 2  # data + our program
    assert browser.title == EVIL_KEY
    sections = [s.get_attribute("id") for s in browser.find_elements("css selector", "section")]
    assert sections == ["sec-model", "sec-attention", "sec-x-script-alert-1-script"]
    extra = browser.find_element("css selector", "#sec-x-script-alert-1-script")
    assert extra.find_element("css selector", "h2").text == EVIL_KEY  # shown as text
    assert extra.find_element("css selector", "th").text == EVIL_KEY
    assert extra.find_elements("css selector", "td")[1].text == "\u27e8U+202E\u27e9right"

    # model card: one <bdi> per token, drawn left to right in token order, controls visible
    shown = [*BIDI_TOKENS[:4], "\u27e8U+202E\u27e9evil", *BIDI_TOKENS[5:]]
    card = browser.find_elements("css selector", "#sec-model ol.inputs li bdi")
    assert [b.text for b in card] == shown
    assert all(b.value_of_css_property("unicode-bidi") == "isolate" for b in card)
    lefts = [b.rect["x"] for b in card]
    assert lefts == sorted(lefts) and len(set(lefts)) == len(lefts), lefts
    text = browser.execute_script("return document.body.innerText")
    assert not set(text) & {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
    # the attention view shows the control the same way
    view = [t.text for t in browser.find_elements("css selector", "#ap-view .left .tok")]
    assert view == shown


def test_model_view_click_opens_the_head_and_its_panel(browser, tmp_path):
    """The 122-token, 72-head page: a thumbnail per head; clicking one selects it in the
    head view and shows that head's census panel (label and evidence from the table)."""
    from tests.unit.report.test_build import classified, random_map

    tokens = ["[CLS]", *(f"tok{i}" for i in range(120)), "[SEP]"]
    heads = classified(6, 12)
    page = ap.report.build(maps=[random_map(tokens, layers=6, heads=12, seed=1)],
                           census=heads).save(tmp_path / "model_view.html")
    browser.get(page.as_uri())
    thumbs = browser.find_elements("css selector", "#ap-view .ap-model canvas")
    assert len(thumbs) == 6 * 12
    assert [t.get_attribute("data-l") for t in thumbs[11:13]] == ["0", "1"]  # row per layer
    row = heads.set_index("head_id").loc["L4H7"]
    target = thumbs[4 * 12 + 7]
    assert target.get_attribute("title") == f"L4H7: {row['label']}"
    target.click()
    assert "on" in target.get_attribute("class").split()
    assert browser.find_element("css selector", ".sel-layer").get_attribute("value") == "4"
    assert browser.find_element("css selector", ".sel-head").get_attribute("value") == "7"
    assert browser.find_element("css selector", ".ap-current").text == "layer 4, head 7 (L4H7)"
    shown = [d for d in browser.find_elements("css selector", ".ap-detail") if d.is_displayed()]
    assert len(shown) == 1
    assert shown[0].find_element("css selector", "h3").text.startswith(f"L4H7: {row['label']}")
    assert shown[0].find_element("css selector", ".evidence").text == row["evidence"]
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_notebook_fragments_share_one_page(browser, tmp_path):
    """Two attention-map outputs and a perturbation output on one page: each view mounts on
    its own data (its own thumbnails and tokens), and nothing logs an error."""
    from tests.unit.report.test_build import random_map

    first = random_map(["[CLS]", "a", "<b>b</b>", "[SEP]"], layers=2, heads=3)
    second = random_map(["[CLS]", "x", "[SEP]"], layers=1, heads=2)
    path = tmp_path / "notebook.html"
    path.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
                    + first._repr_html_() + second._repr_html_() + "</body></html>",
                    encoding="utf-8")
    browser.get(path.as_uri())
    views = browser.find_elements("css selector", ".ap-view")
    assert [len(v.find_elements("css selector", ".ap-model canvas")) for v in views] == [6, 2]
    assert [t.text for t in views[0].find_elements("css selector", ".left .tok")] == \
        ["[CLS]", "a", "<b>b</b>", "[SEP]"]
    views[1].find_elements("css selector", ".ap-model canvas")[1].click()
    assert views[1].find_element("css selector", ".ap-current").text == "layer 0, head 1 (L0H1)"
    assert views[0].find_element("css selector", ".ap-current").text == "layer 0, head 0 (L0H0)"
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_a_huge_token_does_not_widen_the_report_or_the_notebook_view(browser, tmp_path):
    """Issue 17: a 10,000-character token made the notebook view 144,736 px wide. Shown cut
    (ending in "…", whole in its tooltip), the page is no wider than the window."""
    from tests.unit.report.test_long_tokens import LONG, TOKEN_CHARS, long_map

    amap = long_map()
    report = ap.report.build(maps=[amap]).save(tmp_path / "long.html")
    notebook = tmp_path / "long_notebook.html"
    notebook.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
                        + amap._repr_html_() + "</body></html>", encoding="utf-8")
    for page in (report, notebook):
        browser.get(page.as_uri())
        window = browser.execute_script("return window.innerWidth")
        assert browser.execute_script("return document.documentElement.scrollWidth") <= window
        cells = browser.find_elements("css selector", ".ap-view .tok")
        assert len(cells) == 2 * len(amap.query_tokens)  # query and key columns
        long_cells = [c for c in cells if c.get_attribute("title") == LONG]
        assert len(long_cells) == 2
        assert all(c.text == "Q" * (TOKEN_CHARS - 1) + "…" for c in long_cells)
        assert all(len(c.text) <= TOKEN_CHARS for c in cells)
        assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
