"""Models whose position ids start after the padding id (RoBERTa, MPNet; issue 24, item 4):
the most tokens they accept is ``max_position_embeddings - padding_idx - 1``, not
``max_position_embeddings``. Checked against the model itself (its forward on the limit and on
one token more), then through encode, the corpus check, ``--truncate`` and ``heads``."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from attnprobe.errors import InputError
from attnprobe.inputs.text import encode, max_length_of, prepare_corpus
from tests.conftest import track
from tests.helpers import run_cli

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # RoBERTa's and MPNet's order: pad is id 1
WORDS = tuple(f"w{i}" for i in range(80))
POSITIONS = 66  # max_position_embeddings
PAD = 1


def word_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """Whitespace words wrapped as RoBERTa wraps them: ``<s> a </s>``, pairs ``<s> a </s></s>
    b </s>``; no length limit of its own (the model's is the only one)."""
    vocab = {t: i for i, t in enumerate((*SPECIALS, *WORDS))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", pad_token="<pad>", eos_token="</s>",
        unk_token="<unk>", cls_token="<s>", sep_token="</s>", mask_token="<unk>")


def tiny(family: str) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    size = dict(vocab_size=len(SPECIALS) + len(WORDS), hidden_size=16, num_hidden_layers=2,
                num_attention_heads=2, intermediate_size=32, max_position_embeddings=POSITIONS,
                initializer_range=0.3)
    if family == "roberta":
        config = transformers.RobertaConfig(pad_token_id=PAD, bos_token_id=0, eos_token_id=2,
                                            **size)
        return track(transformers.RobertaModel(config).eval())
    return track(transformers.MPNetModel(transformers.MPNetConfig(**size)).eval())


def words(n_tokens: int) -> str:
    """A text of ``n_tokens`` tokens once ``<s>`` and ``</s>`` are added."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(n_tokens - 2))


FAMILIES = ("roberta", "mpnet")
LIMIT = POSITIONS - PAD - 1  # position ids run padding_idx + 1 ... padding_idx + n


@pytest.mark.parametrize("family", FAMILIES)
def test_the_limit_is_what_the_forward_accepts(family):
    model, tok = tiny(family), word_tokenizer()
    assert max_length_of(model, tok) == LIMIT
    with torch.no_grad():
        model(**tok(words(LIMIT), return_tensors="pt"))  # the limit runs
        with pytest.raises((IndexError, RuntimeError)):  # one more token does not
            model(**tok(words(LIMIT + 1), return_tensors="pt"))


@pytest.mark.parametrize("family", FAMILIES)
def test_one_token_over_the_limit_is_an_error_or_cut(family):
    model, tok = tiny(family), word_tokenizer()
    assert encode(model, tok, [words(LIMIT)])["input_ids"].shape == (1, LIMIT)
    for n in (LIMIT + 1, POSITIONS):
        with pytest.raises(InputError, match=f"has {n} tokens but the model takes at most "
                                             f"{LIMIT};"):
            prepare_corpus(model, tok, [words(n)])
        cut = encode(model, tok, [words(n)], truncation="cut")
        expected = tok(words(n), truncation=True, max_length=LIMIT)["input_ids"]
        assert cut["input_ids"][0].tolist() == expected and len(expected) == LIMIT
        with torch.no_grad():
            model(**cut)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folders = {}
    for family in FAMILIES:
        folder = tmp_path_factory.mktemp(family)
        tiny(family).save_pretrained(folder)
        word_tokenizer().save_pretrained(folder)
        folders[family] = str(folder)
    return folders


@pytest.mark.parametrize("family", FAMILIES)
def test_cli_truncate_and_refuse(family, saved, tmp_path, capsys):
    out = tmp_path / "maps.npz"
    code, _, err = run_cli(["extract", "--model", saved[family], "--text", words(POSITIONS),
                            "--out", str(out), "--quiet"], capsys)
    assert code == 2 and err.count("\n") == 1 and "takes at most 64" in err, err
    code, _, err = run_cli(["extract", "--model", saved[family], "--text", words(POSITIONS),
                            "--truncate", "--out", str(out), "--quiet"], capsys)
    assert code == 0, err


@pytest.mark.parametrize("family", FAMILIES)
def test_heads_runs_with_the_probe(family, saved, tmp_path, capsys):
    out = tmp_path / "heads.csv"
    code, _, err = run_cli(["heads", "--model", saved[family], "--text", words(12),
                            "--out", str(out), "--quiet"], capsys)
    assert code == 0, err
    assert len(pd.read_csv(out)) == 2 * 2  # layers x heads
