"""Faults 5, 6 and 9 of issue 11 ("One house") that are not tested next to their module:
crafted map files through ``attnprobe report --maps``, census arguments that gave silent or
raw results, and a model on the ``meta`` device. Then faults of issue 17 through the command
line: tables wider than the scope, an ignored ``--max-length``, a causal model diffed against a
bidirectional one, and torchrun settings that hung."""

from __future__ import annotations

import re
import socket

import pandas as pd
import pytest
import torch
import transformers

import attnprobe as ap
from attnprobe.capture import attention_sizes
from attnprobe.errors import InputError
from attnprobe.heads.head_census import census
from tests.conftest import track
from tests.helpers import bert_tokenizer, bert_vocab, run_cli, tiny_bert, tiny_bert_config
from tests.unit.crafted_files import CASES, real_pair


@pytest.fixture(scope="module")
def encoder():
    return ap.load_model("ref:encoder")


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_maps_on_a_crafted_file_is_one_line_and_exit_2(case, tmp_path, capsys):
    build, message = CASES[case]
    build(tmp_path)
    page = tmp_path / "r.html"
    code, printed, err = run_cli(["report", "--maps", str(tmp_path / "maps.npz"),
                                  "--out", str(page)], capsys)
    assert code == 2 and printed == ""
    assert err.startswith("attnprobe: error:") and err.count("\n") == 1, err
    assert re.search(message, err) and "Traceback" not in err and not page.exists()


def test_report_maps_on_a_good_file_still_works(tmp_path, capsys):
    real_pair(tmp_path)
    page = tmp_path / "r.html"
    code, printed, err = run_cli(["report", "--maps", str(tmp_path / "maps.npz"),
                                  "--out", str(page)], capsys)
    assert code == 0, err
    assert page.read_text().count("q1") >= 1 and str(page) in printed


@pytest.mark.parametrize("rows", [0, -1, True, 2.0, "4"])
def test_census_similarity_rows_must_be_a_positive_integer(rows, encoder):
    # 0 gave all distances 0 (silently), -1 a torch RuntimeError. (The CLI has no option for
    # it: `heads` always uses the default.)
    model, tokenizer = encoder
    with pytest.raises(InputError, match=f"similarity_rows must be a positive integer or None "
                                         f"\\(every row\\); got {rows!r}"):
        census(model, tokenizer, ["the cat sat"], similarity_rows=rows, progress=False)


def test_census_similarity_rows_none_and_a_cover_agree(encoder):
    # every row (None) and more rows than the texts have are the same computation
    model, tokenizer = encoder
    texts = ["the cat sat on the mat", "a dog ran"]
    every = census(model, tokenizer, texts, similarity_rows=None, progress=False).distances()
    cover = census(model, tokenizer, texts, similarity_rows=64, progress=False).distances()
    assert every.equals(cover) and (every["js"] > 0).all()


@pytest.mark.parametrize("run", ["extract", "census", "capture"])
def test_a_model_on_the_meta_device_is_an_input_error(run, encoder):
    model, tokenizer = ap.load_model("ref:encoder")
    model.to("meta")

    def captured(model, tokenizer, texts, **kwargs):
        with ap.capture(model):
            model(**tokenizer(texts))

    analysis = {"extract": ap.extract, "census": census, "capture": captured}[run]
    with pytest.raises(InputError, match="on the 'meta' device"):
        analysis(model, tokenizer, ["the cat sat"], progress=False)


def test_census_trees_must_be_trees(encoder):
    from attnprobe.heads.trees import Tree

    model, tokenizer = encoder
    tree = Tree("s", ("the", "cat"), (2, 0), ("det", "root"))
    with pytest.raises(InputError, match=r"trees\[1\] is a str, not a Tree"):
        census(model, tokenizer, trees=[tree, "the cat"], progress=False)
    with pytest.raises(InputError, match="wrap a single tree in a list"):
        census(model, tokenizer, trees=tree, progress=False)


# ----------------------------------------------------------------------------- issue 17
def test_extract_tables_hold_exactly_the_scope_and_the_maps_its_grid(tmp_path, capsys):
    # heads:0.2,1.1 of a 2 x 4 model: the maps keep heads 1 and 2 of both layers (one array),
    # but the summary and the table held L0H1 and L1H2 too
    scope = ["--model", "ref:transformer", "--text", "the cat sat on the mat", "--scope",
             "heads:0.2,1.1", "--quiet"]
    for name in ("x.csv", "x.json"):
        out = tmp_path / name
        code, printed, err = run_cli(["extract", *scope, "--out", str(out)], capsys)
        assert code == 0, err
        assert re.findall(r"\bL\dH\d\b", printed) == ["L0H2", "L1H1"]
        table = pd.read_csv(out) if name.endswith(".csv") else pd.read_json(out)
        assert sorted(set(zip(table["layer"], table["head"], strict=True))) == [(0, 2), (1, 1)]
    code, _, err = run_cli(["extract", *scope, "--out", str(tmp_path / "m.npz")], capsys)
    (amap,) = ap.load_maps(tmp_path / "m.npz")
    assert code == 0 and amap.layers == (0, 1) and amap.heads == (1, 2)


def test_report_max_length_caps_the_census_and_the_views(tmp_path, capsys):
    # --max-length was listed in --help and ignored: both texts ran at full length
    page = tmp_path / "r.html"
    code, printed, err = run_cli(["report", "--model", "ref:encoder", "--text",
                                  "the cat sat on the mat", "--text", "a dog", "--max-length",
                                  "4", "--skip-long", "--out", str(page)], capsys)
    assert code == 0, err
    assert "skipped 1 text longer than the model allows (ids: 0)" in err
    assert printed.startswith("1 sentences, ")
    code, _, err = run_cli(["report", "--model", "ref:encoder", "--text",
                            "the cat sat on the mat", "--max-length", "4", "--quiet",
                            "--out", str(page)], capsys)
    assert code == 2 and "at most 4" in err and err.count("\n") == 1


def test_diff_refuses_a_causal_and_a_bidirectional_model_of_one_shape():
    vocab = bert_vocab()
    bert = tiny_bert(vocab)
    torch.manual_seed(0)
    llama = track(transformers.LlamaModel(transformers.LlamaConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, intermediate_size=32, max_position_embeddings=64)).eval())
    assert attention_sizes(bert) == attention_sizes(llama) == (2, 2)  # one shape
    with pytest.raises(InputError, match=r"^the models' attention differs in kind: model A "
                                         r"\(BertModel\) is bidirectional, model B "
                                         r"\(LlamaModel\) is causal; a diff compares two "
                                         r"checkpoints of one architecture$"):
        ap.heads.diff(bert, llama, bert_tokenizer(vocab), ["the cat sat"], repeated=False)
    encdec = transformers.BertModel(tiny_bert_config(vocab)).eval()
    encdec.config.is_encoder_decoder = True  # as a seq2seq checkpoint says it
    with pytest.raises(InputError, match=r"model A .* is not encoder-decoder, model B .* is "
                                         r"encoder-decoder"):
        ap.heads.diff(bert, encdec, bert_tokenizer(vocab), ["the cat sat"], repeated=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(("env", "message"), [
    ({"RANK": "5"}, "--distributed: RANK=5 must be below WORLD_SIZE=2 (0..1)"),
    ({"RANK": "x"}, "--distributed: RANK must be a whole number; got 'x'"),
    ({"MASTER_ADDR": None}, "--distributed: WORLD_SIZE=2 but MASTER_ADDR is not set"),
    ({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"},
     "--distributed: LOCAL_RANK=3 must be below LOCAL_WORLD_SIZE=2"),
    ({"RANK": "1"}, "--distributed: rank 1 of WORLD_SIZE=2 met no rank 0 at 127.0.0.1:"),
    ({"RANK": "0"}, "--distributed: rank 0 of WORLD_SIZE=2 met no other process at "),
])
def test_bad_torchrun_settings_are_one_line_not_a_hang(env, message, tmp_path, capsys,
                                                       monkeypatch):
    # these hung in init_process_group (torch waits 30 minutes) without a word
    launch = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(_free_port()), "ATTNPROBE_RENDEZVOUS_TIMEOUT": "1", **env}
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in launch.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    out = tmp_path / "m.npz"
    code, printed, err = run_cli(["extract", "--model", "ref:encoder", "--text", "the cat",
                                  "--distributed", "--quiet", "--out", str(out)], capsys)
    assert code == 2 and printed == "" and not out.exists()
    assert err.startswith(f"attnprobe: error: {message}") and err.count("\n") == 1, err
    assert not torch.distributed.is_initialized()
