"""The repeated-token probe goes through each tokenizer's own template.

Tiny tokenizers are built here from vocabularies (no download): BERT's WordPiece
(``[CLS] … [SEP]``), a GPT-2-style byte-level BPE (nothing added), a LLaMA-style BPE whose
post-processor adds ``<s>``, and attnprobe's word tokenizer (``[BOS] …``). The expected
templates are written out per family, not read from the code under test.
"""

from __future__ import annotations

import string
import warnings
from types import SimpleNamespace

import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from attnprobe.core.tokens import special_template, token_classes
from attnprobe.errors import InputError
from attnprobe.heads import census
from attnprobe.heads.probe import (
    DEFAULT_PROBE_LENGTH,
    ProbeLimits,
    probe_length,
    probe_limits,
    probe_vocabulary,
    repeated_tokens,
)
from attnprobe.models.tokenizer import WordTokenizer
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert

LETTERS = string.ascii_lowercase
WORDS = "the cat sat on a mat dog ran big red " + " ".join(f"w{i}" for i in range(30))


def bert():
    return bert_tokenizer(bert_vocab(WORDS))


def gpt2():
    vocab = {"<|endoftext|>": 0, **{c: 1 + i for i, c in enumerate(LETTERS)},
             **{"Ġ" + c: 27 + i for i, c in enumerate(LETTERS)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return transformers.GPT2TokenizerFast(tokenizer_object=backend, bos_token="<|endoftext|>",
                                          eos_token="<|endoftext|>", unk_token="<|endoftext|>")


def llama():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{"▁" + c: 3 + i for i, c in enumerate(LETTERS)},
             **{c: 29 + i for i, c in enumerate(LETTERS)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return transformers.LlamaTokenizerFast(tokenizer_object=backend, bos_token="<s>",
                                           eos_token="</s>", unk_token="<unk>")


def word():
    return WordTokenizer()


# family -> (tokenizer, tokens before the two copies, tokens after them)
FAMILIES = {"bert": (bert, ["[CLS]"], ["[SEP]"]), "gpt2": (gpt2, [], []),
            "llama": (llama, ["<s>"], []), "word": (word, ["[BOS]"], [])}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_probe_is_wrapped_in_the_tokenizers_template(family):
    make, before, after = FAMILIES[family]
    tok = make()
    length = 5
    batch = repeated_tokens(tok, length=length, n_sequences=3, seed=1)
    assert batch["input_ids"].shape == (3, len(before) + 2 * length + len(after))
    assert bool((batch["attention_mask"] == 1).all())
    ordinary = set(probe_vocabulary(tok).tolist())
    for ids in batch["input_ids"].tolist():
        tokens = tok.convert_ids_to_tokens(ids)
        assert tokens[:len(before)] == before
        assert tokens[len(tokens) - len(after):] == after
        body = ids[len(before):len(ids) - len(after)]
        first, second = body[:length], body[length:]
        assert first == second and len(set(first)) == length  # x_1..x_m, distinct, repeated
        assert set(first) <= ordinary
    prefix, suffix = special_template(tok)
    assert tok.convert_ids_to_tokens(prefix) == before
    assert tok.convert_ids_to_tokens(suffix) == after


@pytest.mark.parametrize("family", ["bert", "word"])
def test_the_template_is_what_the_tokenizer_adds_to_a_text(family):
    """Whole-word vocabularies: the probe's tokens, joined into a text and encoded the usual
    way, give the probe's ids back."""
    tok = FAMILIES[family][0]()
    ids = repeated_tokens(tok, length=6, n_sequences=1, seed=3)["input_ids"][0].tolist()
    prefix, suffix = special_template(tok)
    text = " ".join(tok.convert_ids_to_tokens(ids[len(prefix):len(ids) - len(suffix)]))
    encoded = tok(text)["input_ids"]
    encoded = encoded[0].tolist() if isinstance(encoded, torch.Tensor) else encoded
    assert encoded == ids


def test_the_probe_draws_no_special_unknown_or_punctuation_token():
    tok = word()  # its vocabulary starts with [PAD] [UNK] [BOS] and punctuation
    classes = token_classes(tok)
    drawn = set(probe_vocabulary(tok).tolist())
    assert drawn.isdisjoint(classes["special"].tolist())
    assert drawn.isdisjoint(classes["punct"].tolist())
    assert tok.unk_token_id not in drawn
    assert len(drawn) == len(tok) - 3 - len(classes["punct"])


# ---- length -------------------------------------------------------------------------------

def test_the_default_length_fits_the_model_and_the_vocabulary():
    tok = bert()  # 40 ordinary words, [CLS] and [SEP]
    assert probe_length(tok) == DEFAULT_PROBE_LENGTH
    assert probe_length(tok, max_length=20) == (20 - 2) // 2
    few = bert_tokenizer(bert_vocab("the cat sat on a mat"))
    assert probe_length(few) == 6
    assert probe_length(tok, 7, max_length=16) == 7  # 2 x 7 + 2 = 16


@pytest.mark.parametrize(("tokenizer", "length", "max_length", "message"), [
    (bert, 8, 16, r"probe length 8 needs 2 x 8 \+ 2 = 18 tokens but the model takes at most "
                  r"16; use a probe length of at most 7"),
    (bert, 41, None, "probe length 41 exceeds the tokenizer's 40 ordinary tokens"),
    (bert, 1, None, "probe length must be an integer of at least 2"),
    (bert, 2.5, None, "probe length must be an integer of at least 2"),
    (bert, True, None, "probe length must be an integer of at least 2"),
    (bert, None, 5, r"needs 2 x 2 tokens \+ 2 special, but the model takes 5 tokens"),
    (lambda: bert_tokenizer(bert_vocab("cat")), None, None,
     r"the tokenizer has 1 ordinary token\(s\)"),
])
def test_a_probe_that_does_not_fit_is_a_one_line_error(tokenizer, length, max_length, message):
    with pytest.raises(InputError, match=message) as err:
        probe_length(tokenizer(), length, max_length=max_length)
    assert "\n" not in str(err.value)


def test_census_takes_the_probe_length_and_checks_it_before_any_forward():
    vocab = bert_vocab(WORDS)
    model, tok = tiny_bert(vocab), bert_tokenizer(vocab)  # 64 positions
    texts = ["the cat sat on a mat", "a big dog ran"]
    short = census(model, tok, texts, similarity=False, probe_length=4)
    assert short.probe_length == 4
    assert census(model, tok, texts, similarity=False).probe_length == 31  # (64 - 2) // 2
    assert short.scores()["rep_prev"].notna().all()
    with pytest.raises(InputError, match="probe length 40 needs"):
        census(model, tok, texts, probe_length=40)
    with pytest.raises(InputError, match="probe_length needs the repeated-token probe"):
        census(model, tok, texts, repeated=False, probe_length=4)
    assert census(model, tok, texts, repeated=False, similarity=False).probe_length is None


# ---- the trained context ------------------------------------------------------------------

def test_the_default_fits_the_trained_context_and_a_longer_length_warns():
    tok = word()  # [BOS] x x: one special token
    assert probe_length(tok, max_length=2048, trained_length=48) == (48 - 1) // 2
    assert probe_length(tok, max_length=2048, trained_length=500) == DEFAULT_PROBE_LENGTH
    assert probe_length(tok, max_length=30, trained_length=48) == (30 - 1) // 2  # positions
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # within the trained context: no warning
        assert probe_length(tok, 23, max_length=2048, trained_length=48) == 23
    with pytest.warns(UserWarning) as caught:
        assert probe_length(tok, 32, max_length=2048, trained_length=48) == 32
    (message,) = [str(w.message) for w in caught]
    assert message == ("probe length 32 builds 65 tokens, more than the 48 the model was "
                       "trained on: its heads may not behave as trained there; a length of at "
                       "most 23 fits")
    with pytest.raises(InputError, match="the model takes at most 60"):  # positions: an error
        probe_length(tok, 32, max_length=60, trained_length=48)


class _Model(torch.nn.Module):
    def __init__(self, positions=None, trained=None, on_config=False):
        super().__init__()
        self.config = SimpleNamespace(max_position_embeddings=positions)
        if trained is not None:
            (self.config if on_config else self).trained_length = trained


def test_the_limits_come_from_the_model_and_its_tokenizer():
    tok = word()  # model_max_length 64 (attnprobe's reference models' positions)
    assert tok.model_max_length == 64
    assert probe_limits(_Model(), tok) == ProbeLimits(64, 64)
    assert probe_limits(_Model(40), tok) == ProbeLimits(40, 40)
    assert probe_limits(_Model(40, 20), tok) == ProbeLimits(40, 20)
    assert probe_limits(_Model(40, 20, on_config=True), tok) == ProbeLimits(40, 20)
    assert probe_limits(_Model(40, 100), tok) == ProbeLimits(40, 40)  # never past positions
    assert probe_limits(_Model(40, True), tok) == ProbeLimits(40, 40)  # not a length


def test_census_probes_within_the_trained_context():
    vocab = bert_vocab(WORDS)
    model, tok = tiny_bert(vocab), bert_tokenizer(vocab)  # 64 positions, [CLS] x x [SEP]
    texts = ["the cat sat on a mat"]
    model.trained_length = 20
    assert census(model, tok, texts, similarity=False).probe_length == (20 - 2) // 2
    with pytest.warns(UserWarning, match="more than the 20 the model was trained on"):
        assert census(model, tok, texts, similarity=False, probe_length=12).probe_length == 12
    with pytest.raises(InputError, match="the model takes at most 64"):
        census(model, tok, texts, probe_length=40)


def test_a_tokenizer_whose_template_cannot_be_found_is_an_error():
    class Opaque:
        def tokenize(self, text):
            return []

        def convert_tokens_to_ids(self, tokens):
            return []

        def __call__(self, text):
            return {"input_ids": [5]}

    with pytest.raises(InputError, match="cannot tell which special tokens Opaque adds"):
        special_template(Opaque())
