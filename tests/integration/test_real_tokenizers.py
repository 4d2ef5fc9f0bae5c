"""Checkpoints as they ship (issue 17): tiny GPT-2 and LLaMA models saved with real BPE
tokenizers trained offline (byte-level ``Ġ`` BPE without a pad token; ``▁`` BPE with byte
fallback, ``<s>`` first, no pad token; :mod:`tests.integration.bpe_models`). Every command
runs through the real command line on them, the API gives the same, left padding changes
nothing, and nothing rendered for people shows a raw byte-level or SentencePiece marker."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import transformers

import attnprobe as ap
from attnprobe.errors import FileFormatError, InputError
from tests.helpers import bert_tokenizer, bert_vocab, run_cli
from tests.integration.bpe_models import STYLES, bpe_lm, bpe_tokenizer, save_bpe_lm

TEXTS = ["The old wooden bridge over the river was finally repaired.\nIt opened  today.",
         "A very small dog followed the children."]
MARKERS = ("Ġ", "Ċ", "▁")  # raw spellings that must never reach people
TEXT = (*(a for t in TEXTS for a in ("--text", t)),)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Per style: the model folder, ones whose tokenizer pads on the left / right, a perturbed copy
    of the model (its weights plus noise) for ``diff``; built once (seconds)."""
    root = tmp_path_factory.mktemp("bpe")
    out = {}
    for style in STYLES:
        tokenizer = bpe_tokenizer(style)
        out[style] = save_bpe_lm(style, root / style, tokenizer)
        for side in ("left", "right"):
            out[f"{style}-{side}"] = save_bpe_lm(style, root / f"{style}-{side}", tokenizer,
                                                 padding_side=side)
        model = bpe_lm(style, tokenizer)
        torch.manual_seed(1)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.05 * torch.randn_like(param))
        model.save_pretrained(root / f"{style}-perturbed")
        tokenizer.save_pretrained(root / f"{style}-perturbed")
        out[f"{style}-perturbed"] = root / f"{style}-perturbed"
    return out


@pytest.fixture(scope="module")
def loaded(folders) -> dict[str, tuple]:
    return {style: ap.load_model(str(folders[style])) for style in STYLES}


def _no_markers(text: str, where: str) -> None:
    found = [m for m in MARKERS if m in text]
    assert not found, f"{where} shows raw {found}"


def test_the_tokenizers_ship_as_the_real_ones_do(loaded):
    gpt2, llama = loaded["gpt2"][1], loaded["llama"][1]
    assert gpt2.pad_token is None and llama.pad_token is None
    assert gpt2("a b")["input_ids"][0] != gpt2.bos_token_id  # nothing added
    assert llama("a b")["input_ids"][0] == llama.bos_token_id  # <s> first
    assert "Ġ" in "".join(gpt2.tokenize(TEXTS[0])) and "Ċ" in "".join(gpt2.tokenize(TEXTS[0]))
    assert "▁" in "".join(llama.tokenize(TEXTS[0]))
    with pytest.raises(ValueError, match="padding token"):  # what attnprobe used to call
        gpt2(TEXTS, padding=True)


# ------------------------------------------------------------------------------ command line
COMMANDS = {
    "extract": ["extract", *TEXT, "--ids", "5 6 7", "--out", "OUT/maps.npz"],
    "table": ["extract", *TEXT, "--scope", "layer:1", "--out", "OUT/maps.csv"],
    "heads": ["heads", *TEXT, "--out", "OUT/heads.csv"],
    "compare": ["compare", *TEXT, "--target", "next-token", "--methods", "saliency",
                "--out", "OUT/compare.csv"],
    "perturb": ["perturb", *TEXT, "--experiment", "ablate", "--sweep", "head",
                "--out", "OUT/perturb.csv"],
    "report": ["report", *TEXT, "--target", "next-token", "--out", "OUT/report.html"],
    "diff": ["diff", *TEXT, "--model-b", "PERTURBED", "--out", "OUT/diff.csv"],
    "generate": ["extract", "--text", TEXTS[1], "--generate", "4", "--out", "OUT/gen.npz"],
}


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_runs_on_the_shipped_checkpoint(folders, style, command, tmp_path,
                                                      capsys):
    argv = [str(tmp_path) + a[3:] if a.startswith("OUT/") else
            str(folders[f"{style}-perturbed"]) if a == "PERTURBED" else a
            for a in COMMANDS[command]]
    code, out, err = run_cli([*argv[:1], "--model", str(folders[style]), *argv[1:]], capsys)
    assert code == 0, err
    _no_markers(out, f"{command}'s printout")
    written = next(tmp_path.iterdir())
    if written.suffix == ".npz":
        maps = ap.load_maps(written)
        assert all(m.query_ids is not None for m in maps)
        assert any(m in t for m in MARKERS for amap in maps for t in amap.query_tokens)  # raw kept
        if command == "generate":
            assert maps[0].prompt_length and maps[0].shape[2] == maps[0].prompt_length + 4
        else:
            assert maps[2].query_ids == (5, 6, 7) and len(maps) == 3
    elif written.suffix == ".csv":
        frame = pd.read_csv(written, keep_default_na=False)
        assert len(frame)
        numbers = frame.select_dtypes("number")
        assert np.isfinite(numbers.to_numpy(dtype=float)[~numbers.isna().to_numpy()]).all()
        for column in ("query_token", "key_token", "token"):
            if column in frame:
                _no_markers(" ".join(frame[column].astype(str)), f"{command}'s {column}")
        if command == "diff":  # the perturbed copy moved some head
            assert frame.select_dtypes("number").abs().to_numpy().max() > 0
    else:
        _no_markers(written.read_text(encoding="utf-8"), "the report")


def test_a_mismatched_tokenizer_is_refused_from_the_command_line(folders, tmp_path, capsys):
    """A tokenizer larger than the model's embedding was an IndexError traceback."""
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=100, n_embd=16, n_layer=1, n_head=2, n_positions=64))
    model.save_pretrained(tmp_path / "small")
    bpe_tokenizer("gpt2").save_pretrained(tmp_path / "small")
    code, _, err = run_cli(["extract", "--model", str(tmp_path / "small"), "--text", "the cat",
                            "--out", str(tmp_path / "m.npz")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "has 400 tokens but GPT2LMHeadModel's input embedding has 100 rows" in err


# ------------------------------------------------------------------------------------- API
@pytest.mark.parametrize("style", STYLES)
def test_every_analysis_runs_from_the_api(loaded, style):
    model, tok = loaded[style]
    side = tok.padding_side
    maps = ap.extract(model, tok, TEXTS, batch_size=2)
    for amap, text in zip(maps, TEXTS, strict=True):
        alone = ap.extract(model, tok, [text])[0]
        assert amap.query_ids == alone.query_ids == tuple(tok(text)["input_ids"])
        assert (amap.pattern - alone.pattern).abs().max().item() <= 1e-5
    by_ids = ap.extract(model, tok, [list(m.query_ids) for m in maps])
    for a, b in zip(maps, by_ids, strict=True):
        assert (a.pattern - b.pattern).abs().max().item() <= 1e-5
    assert len(ap.heads.census(model, tok, TEXTS).classify()) == 8
    assert ap.perturb.run(model, tok, TEXTS, "ablate", sweep="head").change.notna().all()
    assert len(ap.attribution.compare(model, tok, TEXTS, "next-token",
                                      methods=["saliency"]).table)
    generated = ap.extract(model, tok, TEXTS[1:], generate=3)[0]
    assert generated.shape[2] == generated.prompt_length + 3
    assert tok.pad_token is None and tok.padding_side == side  # the tokenizer is untouched


@pytest.mark.parametrize("style", STYLES)
def test_a_left_padding_tokenizer_gives_the_same_maps(folders, loaded, style):
    model, _ = loaded[style]
    _, left = ap.load_model(str(folders[f"{style}-left"]))
    _, right = ap.load_model(str(folders[f"{style}-right"]))
    assert (left.padding_side, right.padding_side) == ("left", "right")
    for a, b in zip(ap.extract(model, right, TEXTS), ap.extract(model, left, TEXTS),
                    strict=True):
        assert a.query_ids == b.query_ids
        assert (a.pattern - b.pattern).abs().max().item() <= 1e-6
    stats = [ap.head_stats(model, t, TEXTS).summary() for t in (right, left)]
    pd.testing.assert_frame_equal(*stats, atol=1e-6)
    assert left.padding_side == "left"


# --------------------------------------------------------------------------- readable tokens
@pytest.mark.parametrize("style", STYLES)
def test_readable_tokens_read_back_as_the_text(loaded, style):
    model, tok = loaded[style]
    amap = ap.extract(model, tok, TEXTS[:1])[0]
    assert amap.info.token_style == {"gpt2": "byte_level", "llama": "metaspace"}[style]
    shown = "".join(amap.readable_tokens()).replace("␣", " ").replace("⏎", "\n")
    decoded = tok.decode(list(amap.query_ids), skip_special_tokens=True)
    assert shown.removeprefix("<s>").strip() == decoded.strip()


@pytest.mark.parametrize("style", STYLES)
def test_nothing_rendered_shows_a_raw_marker(loaded, style):
    pytest.importorskip("matplotlib")
    import matplotlib
    import matplotlib.pyplot as plt

    matplotlib.use("Agg")
    model, tok = loaded[style]
    maps = ap.extract(model, tok, TEXTS)
    _no_markers(maps[0]._repr_html_(), "the notebook view")
    _no_markers(repr(maps[0]), "the map's repr")
    _no_markers(pd.concat([m.to_frame() for m in maps]).to_string(), "to_frame")
    for fig in (ap.plot.attention_head(maps[0], layer=1, head=0), ap.plot.model_view(maps[0])):
        texts = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
        _no_markers(" ".join(texts), "a figure")
        plt.close(fig)
    compared = ap.attribution.compare(model, tok, TEXTS[:1], "next-token",
                                      methods=["saliency"], generate=2)
    _no_markers(compared.table.to_string(), "the comparison table")
    _no_markers(compared._repr_html_(), "the comparison's notebook view")
    _no_markers(pd.concat([a.to_frame() for a in compared.attributions]).to_string(),
                "the attribution tables")
    generated = [m for m in compared.maps if m.prompt_length]
    fig = ap.plot.generation_attention(generated[0], layer=0, head=0)
    _no_markers(" ".join(t.get_text() for t in fig.findobj(matplotlib.text.Text)),
                "the generation figure")
    plt.close(fig)


# ---------------------------------------------------------------------------- loading checks
def _save(model, tokenizer, folder: Path) -> str:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_a_causal_lm_with_a_bert_tokenizer_is_a_one_line_warning(tmp_path):
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    folder = _save(model, bert_tokenizer(bert_vocab()), tmp_path / "m")
    with pytest.warns(UserWarning, match=r"GPT2LMHeadModel is a causal language model but its "
                                         r"tokenizer \(BertTokenizer\) wraps every text in "
                                         r"\[CLS\] … \[SEP\]") as caught:
        ap.load_model(folder)
    assert all("\n" not in str(w.message) for w in caught)


def test_added_tokens_beyond_the_embedding_warn_and_a_text_using_one_is_refused(tmp_path):
    tok = bpe_tokenizer("gpt2")
    model = bpe_lm("gpt2", tok)  # its embedding fits the 400 tokens
    tok.add_special_tokens({"pad_token": "<pad>"})  # added without resizing the model
    folder = _save(model, tok, tmp_path / "m")
    with pytest.warns(UserWarning, match=r"the added token\(s\) <pad> have no row"):
        model, tok = ap.load_model(folder)
    assert len(ap.extract(model, tok, ["the cat"])) == 1  # the filler is not the <pad>
    with pytest.raises(InputError, match=r"text 0 gives token id 400 \('<pad>'\)"):
        ap.extract(model, tok, ["the <pad> cat"])


def test_a_matching_checkpoint_loads_without_a_warning(folders):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for style in STYLES:
            ap.load_model(str(folders[style]))


def test_a_tokenizer_larger_than_the_embedding_is_refused_by_load_model(tmp_path):
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=32))
    folder = _save(model, bpe_tokenizer("llama"), tmp_path / "m")
    with pytest.raises(FileFormatError, match="has 480 tokens but LlamaForCausalLM's input "
                                              "embedding has 300 rows"):
        ap.load_model(folder)
    assert json.loads((tmp_path / "m" / "config.json").read_text())["vocab_size"] == 300
