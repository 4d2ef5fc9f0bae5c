"""``attnprobe compare``: the agreement CSV, the summary, the printout and one-line errors."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import transformers

import attnprobe as ap
from attnprobe.attribution.comparison import AGREEMENT_COLUMNS, DEFAULT_VIEWS, STEP_COLUMNS, compare
from attnprobe.attribution.method_base import Problem
from attnprobe.attribution.metrics import METRICS
from attnprobe.attribution.view_base import VIEWS
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert_config
from tests.helpers import run_cli as run

MODEL = "ref:transformer-classifier"  # untrained, 2 classes, key-token vocabulary
TEXTS = ["key cat the dog red", "a big tree and the sun"]
SUMMARY_COLUMNS = ["source_kind", "view", "layer", "source", "method", "metric", "mean", "std",
                   "n", "frac_significant"]


def base(tmp_path, *extra: str) -> list[str]:
    return ["compare", "--model", MODEL, *(a for t in TEXTS for a in ("--text", t)),
            "--target", "class:1", "--methods", "saliency,leave_one_out", "--views",
            "raw,rollout", "--out", str(tmp_path / "agreement.csv"), *extra]


def test_writes_the_agreement_table_and_the_summary(tmp_path, capsys):
    code, printed, err = run(base(tmp_path, "--summary", str(tmp_path / "summary.csv"),
                                  "--quiet"), capsys)
    assert code == 0 and err == ""
    table = pd.read_csv(tmp_path / "agreement.csv", dtype={"example_id": str})
    assert list(table.columns) == list(AGREEMENT_COLUMNS)
    # per text: (raw, rollout) x 2 layers x 2 methods + the one pair of methods; 4 metrics
    assert len(table) == len(TEXTS) * (2 * 2 * 2 + 1) * 4
    assert set(table.source) == {"raw@L0", "raw@L1", "rollout@L0", "rollout@L1", "saliency"}
    assert table.layer.dropna().map(float.is_integer).all()
    # the same numbers as the library call
    model, tok = ap.load_model(MODEL)
    expected = compare(model, tok, TEXTS, "class:1", methods=["saliency", "leave_one_out"],
                       views=["raw", "rollout"])
    pd.testing.assert_series_equal(table.value, expected.table.value, check_exact=False,
                                   atol=1e-6, rtol=0)
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert list(summary.columns) == SUMMARY_COLUMNS
    assert len(summary) == (2 * 2 * 2 + 1) * 4 and (summary.n == len(TEXTS)).all()
    means = table.groupby(["source", "method", "metric"]).value.mean()
    for item in summary.itertuples():
        assert item.mean == pytest.approx(means[(item.source, item.method, item.metric)])
    # the printout: Kendall tau per (source, method)
    assert f"{len(TEXTS)} texts, target class:1: Kendall tau" in printed
    lines = [line.split() for line in printed.splitlines()[2:]]
    assert {(parts[0], parts[1]) for parts in lines} == {
        *((f"{v}@L{layer}", m) for v in ("raw", "rollout") for layer in (0, 1)
          for m in ("saliency", "leave_one_out")), ("saliency", "leave_one_out")}


def test_layers_query_and_steps(tmp_path, capsys):
    argv = base(tmp_path, "--scope", "layer:1", "--query", "max", "--n-steps", "4", "--methods",
                "integrated_gradients,saliency")
    code, printed, err = run(argv, capsys)
    assert code == 0
    table = pd.read_csv(tmp_path / "agreement.csv")
    assert set(table.source) == {"raw@L1", "rollout@L1", "integrated_gradients"}
    assert f"wrote {len(table)} agreement rows to" in err  # not --quiet: the note is printed
    assert "raw@L1" in printed and "raw@L0" not in printed


def test_file_of_texts_and_a_similarity_target_on_a_saved_bert(tmp_path, capsys):
    vocab = bert_vocab()
    tok = bert_tokenizer(vocab)
    torch.manual_seed(0)
    config = tiny_bert_config(vocab)
    folder = tmp_path / "bert"
    transformers.BertModel(config).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    texts = tmp_path / "texts.txt"
    texts.write_text("the big cat sat on a mat\n\n  a red dog ran\n")
    code, printed, _ = run(["compare", "--model", str(folder), "--text-file", str(texts),
                            "--target", "similarity:the dog sat", "--methods",
                            "saliency,occlusion", "--views", "raw,norm,attn_x_grad",
                            "--out", str(tmp_path / "c.csv"), "--quiet"], capsys)
    assert code == 0
    table = pd.read_csv(tmp_path / "c.csv")
    assert sorted(table.example_id.unique()) == [0, 1]
    assert {"norm@L0", "norm@L1", "attn_x_grad"} <= set(table.source)
    assert "2 texts, target similarity:the dog sat" in printed


@pytest.mark.parametrize(("args", "message"), [
    (["--methods", "saliency,deeplift"], "unknown attribution method 'deeplift'"),
    (["--views", "raw,attention"], "views must be distinct names"),
    (["--target", "class:9"], "target class 9 out of range: the model has 2 classes"),
    (["--target", "colour:1"], "unknown target kind 'colour'"),
    (["--target", "next-token"], "needs language-model logits"),
    (["--scope", "layer:7"], "layers [7] out of range"),
    (["--text-file", "{tmp}/blank.txt"], "has no text"),
    (["--text-file", "{tmp}/missing.txt"], "text file not found"),
    (["--out", "{tmp}/agreement.txt"], "--out must end in"),
    (["--summary", "{tmp}/summary.xlsx"], "--summary must end in"),
    (["--model", "ref:nope"], "unknown reference model"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    (tmp_path / "blank.txt").write_text("\n   \n")
    argv = ["compare", "--model", MODEL, "--target", "class:1", "--methods", "saliency",
            "--views", "raw", "--quiet", "--out", str(tmp_path / "agreement.csv")]
    if not any(a.startswith("--text-file") for a in args):
        argv += ["--text", TEXTS[0]]
    argv += [a.format(tmp=tmp_path) for a in args]
    code, printed, err = run(argv, capsys)
    assert code == 2
    assert err.startswith("attnprobe: error:") and message in err and err.count("\n") == 1
    assert printed == "" and not (tmp_path / "agreement.csv").exists()


def test_no_text_is_one_line(tmp_path, capsys):
    code, printed, err = run(["compare", "--model", MODEL, "--target", "class:1",
                              "--out", str(tmp_path / "a.csv")], capsys)
    assert code == 2 and "no text" in err and err.count("\n") == 1 and printed == ""


@pytest.mark.parametrize(("argv", "message"), [
    (["compare", "--model", MODEL, "--text", "key"], "the following arguments are required: "
                                                    "--target"),
    (["compare", "--text", "key", "--target", "class:1", "--n-steps", "0"], "--n-steps"),
    (["compare", "--text", "key", "--target", "class:1", "--methods", " , "], "--methods"),
    (["compare", "--text", "key", "--target", "class:1", "--scope", "x"], "--scope"),
])
def test_usage_errors_are_one_line(argv, message, capsys):
    code, printed, err = run(argv, capsys)
    assert code == 2
    assert err.startswith("attnprobe: error:") and message in err and err.count("\n") == 1
    assert printed == ""


def test_help_shows_the_example(capsys):
    code, printed, _ = run(["compare", "--help"], capsys)
    assert code == 0
    assert "attnprobe compare --model minilm" in printed and "--target" in printed


# ---------------------------------------------------------------------------- corpus options
def table_of(tmp_path, name: str = "agreement.csv") -> pd.DataFrame:
    return pd.read_csv(tmp_path / name, dtype={"example_id": str})


def library(**options) -> pd.DataFrame:
    model, tok = ap.load_model(MODEL)
    options = {"methods": ["saliency", "leave_one_out"], "views": ["raw", "rollout"], **options}
    return compare(model, tok, options.pop("texts", TEXTS), "class:1", **options).table


def test_scope_picks_the_heads_raw_averages_and_repeats_merge(tmp_path, capsys):
    argv = base(tmp_path, "--views", "raw", "--methods", "saliency", "--scope", "head:1.0",
                "--quiet")
    assert run(argv, capsys)[0] == 0
    table = table_of(tmp_path)
    assert set(table.source) == {"raw@L1"}
    one_head = library(views=["raw"], methods=["saliency"], scope="head:1.0")
    whole_layer = library(views=["raw"], methods=["saliency"], scope="layer:1")
    pd.testing.assert_series_equal(table.value, one_head.value, check_exact=False, atol=1e-9)
    assert (one_head.value - whole_layer.value).abs().max() > 1e-3  # the head choice mattered

    merged = base(tmp_path, "--views", "raw", "--methods", "saliency", "--scope", "head:0.1",
                  "--scope", "L1", "--quiet")
    assert run(merged, capsys)[0] == 0
    assert set(table_of(tmp_path).source) == {"raw@L0", "raw@L1"}
    want = library(views=["raw"], methods=["saliency"], scope=["head:0.1", "layer:1"])
    pd.testing.assert_series_equal(table_of(tmp_path).value, want.value, check_exact=False,
                                   atol=1e-9)


def test_long_texts_fail_or_are_cut_or_skipped(tmp_path, capsys):
    # TEXTS[0] is 6 tokens with [BOS], TEXTS[1] is 7
    code, printed, err = run(base(tmp_path, "--max-length", "6", "--quiet"), capsys)
    assert code == 2 and printed == "" and err.count("\n") == 1
    assert "text 1 has 7 tokens but the model takes at most 6" in err and "--truncate" in err

    code, printed, _ = run(base(tmp_path, "--max-length", "5", "--truncate", "--quiet"), capsys)
    assert code == 0 and "2 texts, target class:1" in printed
    cut = library(truncation="cut", max_length=5)
    pd.testing.assert_series_equal(table_of(tmp_path).value, cut.value, check_exact=False,
                                   atol=1e-9)

    code, printed, err = run(base(tmp_path, "--max-length", "6", "--skip-long"), capsys)
    assert code == 0
    assert "skipped 1 text longer than the model allows (ids: 1)" in err
    assert "1 text, target class:1" in printed
    table = table_of(tmp_path)
    assert set(table.example_id) == {"0"}
    pd.testing.assert_series_equal(table.value, library(texts=TEXTS[:1]).value,
                                   check_exact=False, atol=1e-9)

    code, _, err = run(base(tmp_path, "--truncate", "--skip-long"), capsys)
    assert code == 2 and "not allowed with argument" in err


def test_seed_reaches_gradient_shap(tmp_path, capsys):
    def shap(seed: str) -> pd.DataFrame:
        argv = base(tmp_path, "--methods", "gradient_shap,saliency", "--views", "raw",
                    "--seed", seed, "--quiet")
        assert run(argv, capsys)[0] == 0
        return table_of(tmp_path)

    three, again, zero = shap("3"), shap("3"), shap("0")
    pd.testing.assert_frame_equal(three, again)
    want = library(methods=["gradient_shap", "saliency"], views=["raw"], seed=3)
    pd.testing.assert_series_equal(three.value, want.value, check_exact=False, atol=1e-9)
    rank = three.metric == "kendall_tau"
    assert (three.value[rank] - zero.value[rank]).abs().max() > 1e-6


def test_batch_size_sets_the_rows_of_each_perturbation_forward(tmp_path, capsys, monkeypatch):
    rows: list[int] = []
    forward = Problem.forward

    def counted(self, input_ids, attention_mask=None):
        rows.append(int(input_ids.shape[0]))
        return forward(self, input_ids, attention_mask)

    monkeypatch.setattr(Problem, "forward", counted)
    assert run(base(tmp_path, "--methods", "leave_one_out,saliency", "--batch-size", "2",
                    "--quiet"), capsys)[0] == 0
    assert max(rows) == 2 and rows.count(2) >= 4  # 5 and 6 deletions, two at a time
    two = table_of(tmp_path)
    rows.clear()
    assert run(base(tmp_path, "--methods", "leave_one_out,saliency", "--quiet"), capsys)[0] == 0
    assert max(rows) == 6  # the default (16) takes every deletion of the longer text at once
    pd.testing.assert_series_equal(two.value, table_of(tmp_path).value, check_exact=False,
                                   atol=1e-6)
    code, _, err = run(base(tmp_path, "--batch-size", "0"), capsys)
    assert code == 2 and "--batch-size" in err


def test_distributed_outside_torchrun_is_a_plain_run(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert run(base(tmp_path, "--quiet"), capsys)[0] == 0
    plain = table_of(tmp_path)
    assert run(base(tmp_path, "--distributed", "--quiet"), capsys)[0] == 0
    pd.testing.assert_frame_equal(plain, table_of(tmp_path))
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_help_and_table_name_the_same_metrics(tmp_path, capsys):
    code, printed, _ = run(["compare", "--help"], capsys)
    assert code == 0
    help_text = " ".join(printed.split())
    assert f"metrics: {', '.join(METRICS)}." in help_text
    assert "spearman_rho" not in help_text
    assert run(base(tmp_path, "--quiet"), capsys)[0] == 0
    assert tuple(table_of(tmp_path).metric.unique()) == METRICS
    others = [name for name in VIEWS.names() if name not in DEFAULT_VIEWS]
    assert "flow" in others and f"also {','.join(others)})" in help_text  # every view offered


# ---------------------------------------------------------------------------- causal models
@pytest.fixture(scope="module")
def lm_dirs(tmp_path_factory):
    """Tiny GPT-2 and LLaMA language models saved with their tokenizers (``--model DIR``)."""
    from tests.integration.causal_lms import save_lm

    root = tmp_path_factory.mktemp("lms")
    return {name: save_lm(name, root / name) for name in ("gpt2", "llama")}


LM_TEXT = "w5 w6 w7 w8 w9 w10"


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_next_token_on_a_saved_decoder_reads_the_last_row_by_default(name, lm_dirs, tmp_path,
                                                                     capsys):
    """The issue's first failure: --target next-token on a decoder, no --query."""
    argv = ["compare", "--model", lm_dirs[name], "--text", LM_TEXT, "--target", "next-token",
            "--methods", "saliency,leave_one_out", "--views", "raw,rollout", "--quiet",
            "--out", str(tmp_path / "agreement.csv")]
    code, printed, err = run(argv, capsys)
    assert code == 0 and err == ""
    table = table_of(tmp_path)
    model, tok = ap.load_model(lm_dirs[name])
    last = compare(model, tok, [LM_TEXT], "next-token", methods=["saliency", "leave_one_out"],
                   views=["raw", "rollout"], query="last")
    pd.testing.assert_series_equal(table.value, last.table.value, check_exact=False, atol=1e-9)
    # what the views read: the last row of every layer, not the constant first row
    raw = next(a for a in last.attributions if a.method == "raw@L1")
    amap = ap.extract(model, tok, [LM_TEXT])[0]
    assert torch.allclose(raw.scores, amap.pattern[1, :, -1].mean(0).double())
    assert "1 text, target next-token" in printed


def test_next_token_on_ref_induction(tmp_path, capsys):
    text = "t01 t02 t03 t04 t05 t06 t07 t08 t09 t01 t02 t03"
    argv = ["compare", "--model", "ref:induction", "--text", text, "--target", "next-token",
            "--methods", "saliency", "--views", "raw", "--quiet",
            "--out", str(tmp_path / "agreement.csv")]
    assert run(argv, capsys)[0] == 0
    model, tok = ap.load_model("ref:induction")
    want = compare(model, tok, [text], "next-token", methods=["saliency"], views=["raw"],
                   query="last")
    pd.testing.assert_series_equal(table_of(tmp_path).value, want.table.value,
                                   check_exact=False, atol=1e-9)


def test_generate_explains_each_generated_token(tmp_path, capsys):
    text = "t01 t02 t03 t04 t05 t06 t07 t08 t09 t01 t02"
    argv = ["compare", "--model", "ref:induction", "--text", text, "--target", "next-token",
            "--generate", "3", "--methods", "saliency", "--views", "raw", "--quiet",
            "--out", str(tmp_path / "steps.csv")]
    code, printed, _ = run(argv, capsys)
    assert code == 0
    table = pd.read_csv(tmp_path / "steps.csv", dtype={"example_id": str, "token": str})
    assert list(table.columns) == list(STEP_COLUMNS)
    # the induction model continues the repeated segment: t03, t04, t05
    steps = table.drop_duplicates("step")
    assert steps[["step", "position", "token"]].values.tolist() == [
        [1, 12, "t03"], [2, 13, "t04"], [3, 14, "t05"]]
    model, tok = ap.load_model("ref:induction")
    want = compare(model, tok, [text], "next-token", generate=3, methods=["saliency"],
                   views=["raw"])
    pd.testing.assert_series_equal(table.value, want.table.value, check_exact=False, atol=1e-9)
    assert "1 text, target next-token: Kendall tau (mean over 3 generated tokens each)" in printed


@pytest.mark.parametrize(("args", "message"), [
    (["--query", "middle"], "query must be one of ['auto', 'cls', 'first', 'last'"),
    (["--query", "40"], "query row 40 out of range for 4 query tokens"),
    (["--query", "last", "--text", ""], "text 1 is empty"),
    (["--generate", "0"], "generate must be a positive integer"),
    (["--sample"], "--sample needs --generate N"),
    (["--generate", "2", "--target", "class:1"], "give target 'next-token'"),
    (["--generate", "2045"], "text 0 has 4 tokens; with generate=2045 the sequence needs 2049"),
    (["--generate", "2", "--model", "ref:encoder"], "attends both ways (an encoder)"),
])
def test_causal_bad_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    argv = ["compare", "--model", "ref:induction", "--text", "t01 t02 t03", "--target",
            "next-token", "--methods", "saliency", "--views", "raw", "--quiet",
            "--out", str(tmp_path / "agreement.csv"), *args]
    if "ref:encoder" in args:
        argv[argv.index("--text") + 1] = "the cat sat"
    code, printed, err = run(argv, capsys)
    assert code == 2, err
    assert err.startswith("attnprobe: error:") and message in err and err.count("\n") == 1
    assert printed == "" and not (tmp_path / "agreement.csv").exists()
