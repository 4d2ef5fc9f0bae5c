"""Issue 24 items 6 and 9: the report's patching defaults run as documented (the README's
``report --corrupt-file`` command and ``ap.report.from_model(..., corrupt=...)`` as written:
``logit:next`` at every position with a next token), and a text of one token is left out of
the causal sections that read a next token, with a note on the page, instead of failing the
whole report. The expected tables are those of ``ap.patch.heads`` /
``ap.heads.logit_attribution`` run on their own with the positions spelled out."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest

import attnprobe as ap
from tests.helpers import run_cli as run
from tests.integration.causal_lms import causal_lm, save_lm

README = Path(__file__).resolve().parents[3] / "README.md"
TEXTS = ["t01 t02 t03 t04 t01 t02 t03", "t05 t06 t07 t05 t06 t07 t05"]
CORRUPT = ["t11 t12 t13 t14 t01 t02 t03", "t15 t16 t17 t18 t06 t07 t05"]


@pytest.fixture(scope="module")
def induction():
    return ap.load_model("ref:induction")


def test_from_model_with_corrupt_as_written_patches_every_position_with_a_next_token(induction):
    model, tok = induction
    page = ap.report.from_model(model, tok, TEXTS, view_texts=1, corrupt=CORRUPT)
    assert 'id="sec-patching"' in page.html
    want = ap.patch.heads(model, tok, TEXTS, CORRUPT, "logit:next", metric_positions="all")
    got = page.contents.patching
    assert set(got["metric"]) == {"logit:next(clean)"}
    np.testing.assert_allclose(got["patched"].to_numpy(), want["patched"].to_numpy(),
                               rtol=1e-6, atol=1e-6)  # the same forwards: equal up to float32
    # a metric of fixed tokens still reads the last position by default
    diff = ap.report.from_model(model, tok, TEXTS, view_texts=1, corrupt=CORRUPT,
                                metric="logit_diff:t03,t05", logit_attribution=False,
                                composition=False).contents.patching
    last = ap.patch.heads(model, tok, TEXTS, CORRUPT, "logit_diff:t03,t05",
                          metric_positions="last")
    np.testing.assert_allclose(diff["clean"].to_numpy(), last["clean"].to_numpy(),
                               rtol=1e-6, atol=1e-6)


def readme_report_patching_command() -> str:
    """The README's ``attnprobe report ... --corrupt-file ...`` line, without its comment."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    lines = [line for block in blocks for line in block.splitlines()
             if line.startswith("attnprobe report") and "--corrupt-file" in line]
    assert len(lines) == 1, lines
    return lines[0].split("#")[0]


def test_the_readme_report_corrupt_file_command_runs_as_written(tmp_path, monkeypatch,
                                                                 capsys):
    argv = shlex.split(readme_report_patching_command())[1:]
    monkeypatch.chdir(tmp_path)
    folder = Path(argv[argv.index("--model") + 1])
    save_lm("gpt2", folder)  # the README's ./my-lm: a tiny GPT-2 with a word tokenizer
    Path(argv[argv.index("--text-file") + 1]).write_text("w5 w6 w7 w8 w5 w6\nw9 w10 w11 w9\n")
    Path(argv[argv.index("--corrupt-file") + 1]).write_text("w20 w21 w7 w8 w5 w6\n"
                                                            "w30 w10 w11 w9\n")
    code, _, err = run(argv, capsys)
    assert code == 0, err
    page = Path(argv[argv.index("--out") + 1]).read_text()
    assert 'id="sec-patching"' in page and "logit:next(clean)" in page


@pytest.mark.parametrize("corrupt", [None, ["w20 w6 w7", "w21", "w22 w10 w11"]])
def test_a_text_of_one_token_is_left_out_of_the_causal_sections_with_a_note(corrupt):
    model, tok = causal_lm("gpt2")  # no [BOS]: "w8" is one token
    texts = ["w5 w6 w7", "w8", "w9 w10 w11"]
    assert [len(tok(t)["input_ids"]) for t in texts] == [3, 1, 3]
    page = ap.report.from_model(model, tok, texts, view_texts=1, corrupt=corrupt)
    dla = page.contents.logit_attribution
    assert sorted(set(dla.totals["example_id"])) == ["0", "2"]
    alone = ap.heads.logit_attribution(model, tok, [texts[2]], "logit:next",
                                       metric_positions="all")
    np.testing.assert_allclose(dla.totals[dla.totals["example_id"] == "2"]["value"],
                               alone.totals["value"], rtol=1e-6, atol=1e-6)
    note = "Text(s) 1 have one token, so no next token to read: left out of the"
    assert f"{note} direct logit attribution." in page.html
    if corrupt is not None:
        assert sorted(set(page.contents.patching["example_id"])) == ["0", "2"]
        assert f"{note} patching." in page.html
