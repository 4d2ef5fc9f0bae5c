"""``attnprobe report``: one self-contained page, one-line errors."""

import re

import pytest

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
    corrupt = tmp_path / "corrupt.txt"
    corrupt.write_text("The dog sat.\n", encoding="utf-8")
    assert main(["report", "--maps", str(maps), "--corrupt-file", str(corrupt),
                 "--out", str(out)]) == 2
    assert "--corrupt-file" in capsys.readouterr().err.splitlines()[-1]


# ---------------------------------------------------------------------------- causal models
def _comparison_sources(page: str) -> set[str]:
    """The sources listed in the page's attribution-comparison table."""
    section = page[page.index('id="sec-comparison"'):]
    section = section[:section.index("</section>")] if "</section>" in section else section
    return set(re.findall(r"(raw@L\d|rollout@L\d|integrated_gradients|saliency)", section))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_report_with_next_token_attributions_on_a_saved_decoder(name, tmp_path, capsys):
    """The issue's second failure: no page with attributions could be built for a decoder."""
    from tests.integration.causal_lms import save_lm

    folder = save_lm(name, tmp_path / name)
    out = tmp_path / "report.html"
    assert main(["report", "--model", folder, "--text", "w5 w6 w7 w8 w9", "--text",
                 "w10 w11 w12 w13", "--target", "next-token", "--n-steps", "3",
                 "--out", str(out), "--quiet"]) == 0
    page = out.read_text(encoding="utf-8")
    assert 'id="sec-comparison"' in page and "kendall_tau" in page
    assert {"raw@L0", "rollout@L1", "saliency"} <= _comparison_sources(page)


def test_report_on_ref_induction_with_generation_marks_the_generated_tokens(tmp_path, capsys):
    from attnprobe.report.data import read_script_json
    from attnprobe.report.page import MAPS_ID

    out = tmp_path / "report.html"
    prompt = "t01 t02 t03 t04 t05 t06 t07 t08 t09 t01 t02"
    assert main(["report", "--model", "ref:induction", "--text", prompt, "--target",
                 "next-token", "--generate", "3", "--query", "last", "--n-steps", "3",
                 "--out", str(out), "--quiet"]) == 0
    page = out.read_text(encoding="utf-8")
    (packed,) = read_script_json(page, MAPS_ID)
    assert packed["prompt_length"] == 12 and len(packed["query_tokens"]) == 15
    assert packed["query_tokens"][12:] == ["t03", "t04", "t05"]  # the copy continues
    assert 'class="gen-note"' in page and 'id="sec-comparison"' in page


@pytest.mark.parametrize(("args", "message"), [
    (["--query", "middle"], "query must be one of"),
    (["--generate", "2", "--model", "ref:encoder", "--text", "the cat"], "attends both ways"),
    (["--generate", "2", "--target", "class:1"], "give target 'next-token'"),
    (["--sample"], "--sample needs --generate N"),
])
def test_report_causal_errors_are_one_line(args, message, tmp_path, capsys):
    argv = ["report", "--model", "ref:induction", "--text", "t01 t02 t03",
            "--out", str(tmp_path / "r.html"), "--quiet", *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnprobe: error:") and message in err and err.count("\n") == 1
    assert not (tmp_path / "r.html").exists()


# ---------------------------------------------------------------------------- causal sections
CLEAN = ["t01 t02 t03 t04 t01 t02 t03", "t05 t06 t07 t05 t06 t07 t05"]
CORRUPTED = ["t11 t12 t13 t14 t01 t02 t03", "t15 t16 t17 t18 t06 t07 t05"]


def _files(tmp_path, corrupt=CORRUPTED):
    clean, bad = tmp_path / "clean.txt", tmp_path / "corrupt.txt"
    clean.write_text("\n".join(CLEAN) + "\n", encoding="utf-8")
    bad.write_text("\n".join(corrupt) + "\n", encoding="utf-8")
    return str(clean), str(bad)


def test_report_with_a_corrupt_file_adds_patching_to_the_causal_sections(tmp_path, capsys):
    import attnprobe as ap
    from attnprobe.patch import summary

    clean, corrupt = _files(tmp_path)
    out = tmp_path / "report.html"
    assert main(["report", "--model", "ref:induction", "--text-file", clean, "--corrupt-file",
                 corrupt, "--metric-positions", "all", "--site", "v", "--no-composition",
                 "--out", str(out), "--quiet"]) == 0
    page = out.read_text(encoding="utf-8")
    assert 'id="sec-logit-attribution"' in page and 'id="sec-patching"' in page
    assert 'id="sec-composition"' not in page
    # the patching section shows ap.patch.heads of the pairs, with the flags' options
    model, tok = ap.load_model("ref:induction")
    table = ap.patch.heads(model, tok, CLEAN, CORRUPTED, "logit:next", site="v",
                           metric_positions="all")
    effect = summary(table).set_index(["layer", "head"])["effect"]
    assert len(effect) == 8
    for (layer, head), value in effect.items():  # each head's cell, its mean effect
        assert f"L{layer}H{head}: effect {float(value):.4g} (" in page
    assert "heads v (denoising), logit:next" in page


@pytest.mark.parametrize(("args", "message"), [
    (["--site", "k"], "--site applies to patching: give --corrupt-file"),
    (["--metric", "logit:t01"], "--metric applies to patching"),
    ("corrupt", "1 corrupted input(s) for 2 text(s)"),
    ("corrupt+receivers", "--receivers applies to --patch path, not heads"),
    ("corrupt+path", "path patching needs receivers"),
])
def test_report_patching_errors_are_one_line(args, message, tmp_path, capsys):
    clean, corrupt = _files(tmp_path, CORRUPTED[:1] if args == "corrupt" else CORRUPTED)
    argv = ["report", "--model", "ref:induction", "--text-file", clean,
            "--out", str(tmp_path / "r.html"), "--quiet"]
    extra = {"corrupt": ["--corrupt-file", corrupt],
             "corrupt+receivers": ["--corrupt-file", corrupt, "--receivers", "layer:1"],
             "corrupt+path": ["--corrupt-file", corrupt, "--patch", "path"]}
    assert main(argv + (extra[args] if isinstance(args, str) else args)) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnprobe: error:") and message in err and err.count("\n") == 1
    assert not (tmp_path / "r.html").exists()


def test_report_refuses_to_overwrite_the_corrupt_file(tmp_path, capsys):
    clean, _ = _files(tmp_path)
    corrupt = tmp_path / "corrupt.html"  # a page name: only the input check can refuse it
    corrupt.write_text("\n".join(CORRUPTED) + "\n", encoding="utf-8")
    assert main(["report", "--model", "ref:induction", "--text-file", clean, "--corrupt-file",
                 str(corrupt), "--out", str(corrupt)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnprobe: error:") and "--corrupt-file" in err
    assert corrupt.read_text(encoding="utf-8").splitlines() == CORRUPTED
