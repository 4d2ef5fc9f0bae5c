"""``attnprobe diff`` on tiny saved BERTs: two checkpoints, a checkpoint and itself, and
pairs that cannot be compared."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import transformers

from tests.helpers import bert_tokenizer, bert_vocab, run_cli

WORDS = "the cat sat on a mat dog ran big red " + " ".join(f"w{i}" for i in range(40))


def save_bert(folder, vocab, seed=0, **sizes) -> str:
    torch.manual_seed(seed)
    config = dict(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2,
                  num_attention_heads=2, intermediate_size=32, max_position_embeddings=64,
                  initializer_range=0.3)
    transformers.BertModel(transformers.BertConfig(**{**config, **sizes})).eval() \
        .save_pretrained(folder)
    bert_tokenizer(vocab).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two checkpoints of one tiny BERT (seeds 0 and 1), one with 3 layers, one with a bigger
    vocabulary."""
    root = tmp_path_factory.mktemp("diff_models")
    vocab = bert_vocab(WORDS)
    return {"a": save_bert(root / "a", vocab), "b": save_bert(root / "b", vocab, seed=1),
            "deep": save_bert(root / "deep", vocab, num_hidden_layers=3),
            "vocab": save_bert(root / "vocab", bert_vocab(WORDS + " extra")),
            "causal": save_bert(root / "causal", vocab, is_decoder=True)}  # same shape


@pytest.fixture
def texts(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("the cat sat on a mat\na big dog ran\n\nthe red cat ran on the mat\n")
    return path


def test_two_checkpoints_give_heads_layers_and_scores(models, texts, tmp_path, capsys):
    out, layers, scores = tmp_path / "d.csv", tmp_path / "l.json", tmp_path / "s.csv"
    code, printed, err = run_cli(["diff", "--model", models["a"], "--model-b", models["b"],
                                  "--text-file", str(texts), "--out", str(out), "--layers",
                                  str(layers), "--scores", str(scores)], capsys)
    assert code == 0, err
    heads = pd.read_csv(out)
    assert len(heads) == 4 and list(heads.columns[:8]) == [
        "stack", "kind", "layer", "head", "head_id", "label_a", "label_b", "label_changed"]
    assert heads["js"].between(0, 0.6931472).all() and (heads["js"] > 0).all()
    assert (heads["rows"] == 8 + 6 + 9).all() and (heads["examples"] == 3).all()  # [CLS] [SEP]
    assert "entropy_change" in heads and "rep_prev_change" in heads
    summary = pd.read_json(layers)
    assert list(summary["layer"]) == [0, 1] and (summary["n_heads"] == 2).all()
    assert summary["js"].tolist() == pytest.approx(heads.groupby("layer")["js"].mean().tolist())
    long = pd.read_csv(scores)
    assert set(long.columns) >= {"score", "a", "b", "change"} and len(long) % 4 == 0
    assert printed.startswith("3 sentences, 4 heads: mean JS ")
    assert "top_head" in printed and "census" in err and f"wrote 4 heads to {out}" in err


def test_a_checkpoint_with_itself_changes_nothing(models, texts, tmp_path, capsys):
    out = tmp_path / "d.csv"
    code, printed, err = run_cli(["diff", "--model", models["a"], "--model-b", models["a"],
                                  "--text-file", str(texts), "--no-repeated", "--quiet",
                                  "--out", str(out)], capsys)
    assert code == 0 and err == ""
    heads = pd.read_csv(out)
    assert (heads["js"] == 0).all() and not heads["label_changed"].any()
    assert "rep_prev_change" not in heads
    assert "mean JS 0 nats; 0 labels changed" in printed


@pytest.mark.parametrize("other, message", [
    ("deep", "the models differ in shape: 2 layers x 2 heads vs 3 x 2"),
    ("vocab", "vocabularies differ (55 vs 56 token embeddings)"),
    # issue 17: a bidirectional and a causal model of the same shape were diffed head by head
    pytest.param("causal", "the models' attention differs in kind: model A (BertModel) is "
                           "bidirectional, model B (BertModel) is causal",
                 marks=pytest.mark.filterwarnings("ignore::UserWarning")),  # BERT's tokenizer
])
def test_pairs_that_cannot_be_compared_exit_2_in_one_line(models, texts, other, message,
                                                          tmp_path, capsys):
    out = tmp_path / "d.csv"
    code, printed, err = run_cli(["diff", "--model", models["a"], "--model-b", models[other],
                                  "--text-file", str(texts), "--quiet", "--out", str(out)],
                                 capsys)
    assert code == 2 and printed == "" and err.count("\n") == 1
    assert err.startswith("attnprobe: error: ") and message in err
    assert not out.exists()


def test_usage_errors(models, texts, tmp_path, capsys):
    code, _, err = run_cli(["diff", "--model", models["a"], "--text-file", str(texts)], capsys)
    assert code == 2 and "--model-b" in err and err.count("\n") == 1
    same = str(tmp_path / "x.csv")
    code, _, err = run_cli(["diff", "--model", models["a"], "--model-b", models["b"],
                            "--text-file", str(texts), "--out", same, "--layers", same], capsys)
    assert code == 2 and err.count("\n") == 1 and "x.csv" in err


CONLLU = "".join(
    f"# sent_id = s{n}\n" + "".join(f"{i}\t{w}\t{w}\t_\t_\t_\t{h}\t{r}\t_\t_\n"
                                     for i, (w, h, r) in enumerate(words, 1)) + "\n"
    for n, words in enumerate([
        [("the", 2, "det"), ("cat", 3, "nsubj"), ("sat", 0, "root"), ("on", 6, "case"),
         ("a", 6, "det"), ("mat", 3, "obl")],
        [("a", 3, "det"), ("big", 3, "amod"), ("dog", 4, "nsubj"), ("ran", 0, "root")]]))


def test_trees_from_conllu_compare_syntax_scores_too(models, tmp_path, capsys):
    conllu = tmp_path / "trees.conllu"
    conllu.write_text(CONLLU)
    out = tmp_path / "d.csv"
    code, printed, err = run_cli(["diff", "--model", models["a"], "--model-b", models["b"],
                                  "--conllu", str(conllu), "--no-repeated", "--quiet",
                                  "--out", str(out)], capsys)
    assert code == 0, err
    heads = pd.read_csv(out)
    assert "dep_alignment_change" in heads and heads["dep_alignment_change"].notna().all()
    assert printed.startswith("2 sentences, 4 heads")
