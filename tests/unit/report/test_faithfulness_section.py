"""The faithfulness section of the report and the notebook view of a ``Faithfulness``: the
ranked summary with its intervals, the curves and the ranking as SVG, drawn from a
hand-built result whose means are written out (:mod:`tests.unit.faithfulness.synthetic`);
and ``attnprobe report --faithfulness`` on a tiny classifier."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.report.figure_svg import svg_figures
from tests.helpers import run_cli as run
from tests.unit.faithfulness import synthetic

METRICS = ("aopc_comprehensiveness", "aopc_sufficiency", "abpc", "tau_loo")


def _g(value: float) -> str:
    return f"{value:.4g}"


def _section(html: str) -> str:
    found = re.search(r'<section id="sec-faithfulness">.*?</section>', html, re.S)
    assert found, "no faithfulness section"
    return found.group(0)


def _rows(html: str) -> list[list[str]]:
    """The cells of the first table in ``html``."""
    body = re.search(r"<tbody>(.*?)</tbody>", html, re.S).group(1)
    return [re.findall(r"<td>(.*?)</td>", row, re.S)
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def _svgs(html: str) -> list[ET.Element]:
    return [ET.fromstring(s) for s in re.findall(r"<svg\b.*?</svg>", html, re.S)]


def _check_summary_table(html: str, found) -> None:
    """The first table: ranked by AOPC comprehensiveness (saliency 0.6 > raw 0.2 > random
    0.15), each metric ``mean [low, high]`` with the hand mean and the summary's interval."""
    rows = _rows(html)
    summary = found.summary().set_index("source")
    assert [r[:2] for r in rows] == [["1", "saliency"], ["2", "raw@L1"], ["3", "random"]]
    for row in rows:
        source = row[1]
        assert row[3] == str(sum(1 for _ in synthetic.EXAMPLES))  # n
        for metric, cell in zip(METRICS, row[4:8], strict=True):
            low, high = summary.loc[source, [f"{metric}_low", f"{metric}_high"]]
            want = f"{_g(synthetic.mean_of(source, metric))} [{_g(low)}, {_g(high)}]"
            assert cell == want, (source, metric)


def test_the_page_section_shows_the_ranking_and_both_figures():
    found = synthetic.result()
    page = ap.report.build(faithfulness=found)
    section = _section(page.html)
    assert "<h2>Faithfulness</h2>" in section
    assert "3 text(s), removal delete, target class:1" in section
    assert "1 row(s) without a value" in section  # the NaN τ of raw@L1, text 1
    _check_summary_table(section, found)
    curves, ranking = _svgs(section)
    assert curves.get("class") == "faithfulness-curves"
    assert ranking.get("class") == "faithfulness-ranking"
    assert not re.search(r"https?:", page.html)


def test_the_curve_points_are_the_hand_mean_drops():
    curves, _ = svg_figures("faithfulness", synthetic.result())
    series = {g.get("data-name"): g for g in ET.fromstring(str(curves)).iter("g")}
    assert set(series) == {f"{s} {c}" for s in synthetic.KINDS
                           for c in ("deletion_morf", "deletion_lerf")}
    for name, group in series.items():
        source, curve = name.split()
        tips = [c.find("title").text for c in group.iter("circle")]
        want = synthetic.mean_drop(source, curve)
        assert [re.search(r"mean drop (\S+)", t).group(1) for t in tips] == \
            [_g(v) for v in want]
        # drawn upwards: a larger drop is higher on the page (smaller y)
        ys = [float(c.get("cy")) for c in group.iter("circle")]
        order = sorted(range(len(want)), key=lambda i: want[i])
        assert len(set(want)) == len(want)  # distinct means: the order is strict
        assert [ys[i] for i in order] == sorted(ys, reverse=True)
        dash = group.find("polyline").get("stroke-dasharray")
        assert (dash is None) == (curve == "deletion_morf")


def test_the_dots_are_ranked_with_whiskers_and_the_baseline_is_a_line():
    found = synthetic.result()
    _, ranking = svg_figures("faithfulness", found, metric="abpc")
    svg = ET.fromstring(str(ranking))
    dots = [g for g in svg.iter("g") if g.get("class") == "ap-dot"]
    assert [d.get("data-source") for d in dots] == ["saliency", "raw@L1"]  # 0.4 > 0.1
    xs = []
    for dot in dots:
        circle, whisker = dot.find("circle"), dot.find("line")
        x = float(circle.get("cx"))
        assert float(whisker.get("x1")) <= x <= float(whisker.get("x2"))
        mean = synthetic.mean_of(dot.get("data-source"), "abpc")
        assert f"abpc {_g(mean)} [" in circle.find("title").text
        xs.append(x)
    assert xs[0] > xs[1]  # the better source further right
    baseline = [g for g in svg.iter("g") if g.get("class") == "ap-baseline"]
    assert [b.get("data-source") for b in baseline] == ["random"]
    line = baseline[0].find("line")
    assert line.get("stroke-dasharray") and line.get("x1") == line.get("x2")
    assert f"abpc {_g(synthetic.mean_of('random', 'abpc'))} [" in line.find("title").text


def test_the_notebook_view_is_the_same_body_self_contained():
    found = synthetic.result(sanity=True)
    html = found._repr_html_()
    assert html and not re.search(r"https?:", html)
    _check_summary_table(html, found)
    assert len(_svgs(html)) == 2
    # the sanity check's columns: raw@L1's ranking barely changed (0.9 > 0.5) and is flagged
    rows = {r[1]: r for r in _rows(html)}
    assert rows["raw@L1"][-2:] == [_g(0.9), "True"] and rows["saliency"][-1] == "False"


def test_report_faithfulness_needs_a_target(tmp_path, capsys):
    code, _, err = run(["report", "--model", "ref:transformer-classifier", "--text",
                        "key cat the dog", "--faithfulness", "--out",
                        str(tmp_path / "r.html")], capsys)
    assert code == 2 and err.count("\n") == 1 and "pass target=" in err
    assert not (tmp_path / "r.html").exists()
    with pytest.raises(InputError, match="without generate"):
        ap.report.from_model(None, None, ["x"], target="next-token", generate=2,
                             faithfulness=True)


def test_report_faithfulness_tests_the_compared_sources(tmp_path, capsys):
    from attnprobe.report.pipeline import REPORT_METHODS, REPORT_VIEWS

    texts = ["key cat the dog red"]  # one text: the CLI and the Python call cost ~5 s each
    out = tmp_path / "r.html"
    code, _, _ = run(["report", "--model", "ref:transformer-classifier",
                      *(a for t in texts for a in ("--text", t)), "--target", "class:1",
                      "--faithfulness", "--n-steps", "3", "--quiet", "--out", str(out)], capsys)
    assert code == 0
    model, tok = ap.load_model("ref:transformer-classifier")
    want = ap.faithfulness.evaluate(model, tok, texts, "class:1", methods=list(REPORT_METHODS),
                                    views=list(REPORT_VIEWS), n_steps=3, truncation="cut")
    summary = want.summary()
    rows = _rows(_section(out.read_text(encoding="utf-8")))
    assert [r[1] for r in rows] == summary["source"].tolist()
    for row, item in zip(rows, summary.itertuples(), strict=True):
        assert row[4] == (f"{_g(item.aopc_comprehensiveness)} "
                          f"[{_g(item.aopc_comprehensiveness_low)}, "
                          f"{_g(item.aopc_comprehensiveness_high)}]")
