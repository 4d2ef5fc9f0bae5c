"""``attnprobe report``: one self-contained page, one-line errors."""

import re

from attnprobe.cli import main


def test_report_writes_a_self_contained_page(tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("The cat sat on the mat.\nA <b>bold</b> dog barked.\n", encoding="utf-8")
    out = tmp_path / "page" / "report.html"
    assert main(["report", "--text-file", str(texts), "--out", str(out), "--quiet",
                 "--view-texts", "2"]) == 0
    assert "2 sentences, 2 in the attention view" in capsys.readouterr().out
    page = out.read_text(encoding="utf-8")
    assert page.lstrip().lower().startswith("<!doctype html")
    assert not re.search(r"https?:", page)  # nothing to fetch: opens from disk offline
    # the tokens "<", "b", ">" are data, never markup: escaped in the page and in its JSON
    assert "<b>" not in page and "\\u003c" in page
    assert "<bdi>&lt;</bdi> <bdi>b</bdi> <bdi>&gt;</bdi>" in page
    assert len(re.findall(r"<script\b", page)) == 2  # the data block and our program


def test_report_errors_are_one_line(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n", encoding="utf-8")
    assert main(["report", "--text", "hi", "--out", str(tmp_path / "r.csv")]) == 2
    assert main(["report", "--text-file", str(empty), "--out", str(tmp_path / "r.html")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(e.startswith("attnprobe: error:") for e in errors)


def test_report_with_attributions_and_a_perturbation(tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["report", "--text", "The cat chased a small mouse.", "--text",
                 "A dog barked at the old man.", "--target", "similarity:A pet.",
                 "--n-steps", "5", "--perturb", "uniform", "--scope", "layer:0",
                 "--out", str(out), "--quiet"]) == 0
    page = out.read_text(encoding="utf-8")
    for section in ("sec-model", "sec-heads", "sec-attention", "sec-comparison",
                    "sec-perturbation"):
        assert f'id="{section}"' in page, section
    assert "kendall_tau" in page and "uniform" in page
    assert main(["report", "--text", "hi there", "--perturb", "bogus",
                 "--out", str(tmp_path / "r.html")]) == 2


def test_report_from_saved_maps(tmp_path, capsys):
    maps = tmp_path / "maps.npz"
    assert main(["extract", "--text", "The cat sat.", "--out", str(maps)]) == 0
    out = tmp_path / "from_maps.html"
    assert main(["report", "--maps", str(maps), "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert 'id="sec-attention"' in page and "cat" in page
    assert main(["report", "--maps", str(maps), "--text", "x", "--out", str(out)]) == 2
