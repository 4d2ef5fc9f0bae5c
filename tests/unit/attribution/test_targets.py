"""Targets: each kind reads the number it names off the output; each error says what to change."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

import attnprobe
from attnprobe.attribution.targets import TARGET_KINDS, Target, parse_target
from attnprobe.errors import InputError
from tests.conftest import track
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert_config


def tiny_bert(head: bool, num_labels: int = 2):
    """A 2-layer random BERT (eval) with a word-piece tokenizer; ``head``: a classifier."""
    vocab = bert_vocab()
    tokenizer = bert_tokenizer(vocab)
    config = tiny_bert_config(vocab, num_labels=num_labels)
    cls = transformers.BertForSequenceClassification if head else transformers.BertModel
    return track(cls(config).eval()), tokenizer


@pytest.fixture(scope="module")
def pooling():
    return attnprobe.load_model("ref:pooling")


@pytest.fixture(scope="module")
def llama():
    return attnprobe.load_model("ref:llama")


def test_class_and_prob_read_the_classifier_logits(pooling):
    model, tok = pooling
    track(model)
    batch = tok(["the cat sat", "a dog ran on the mat"])
    logits = model(**batch)
    assert parse_target(" class: 1", model, tok).spec == "class:1"
    torch.testing.assert_close(parse_target("class:1", model, tok)(logits, batch), logits[:, 1])
    prob = parse_target("prob:0", model, tok)
    assert prob.spec == "prob:0"
    torch.testing.assert_close(prob(logits, batch), torch.softmax(logits, -1)[:, 0])


def test_class_reads_hf_output_logits():
    model, tok = tiny_bert(head=True, num_labels=3)
    batch = dict(tok(["the cat sat"], return_tensors="pt"))
    output = model(**batch)
    torch.testing.assert_close(parse_target("class:2", model, tok)(output, batch),
                               output.logits[:, 2])
    with pytest.raises(InputError, match=r"^target class 3 out of range: the model has 3 "
                                         r"classes \(0\.\.2\)$"):
        parse_target("class:3", model, tok)


def test_class_out_of_range_says_how_many_classes(pooling):
    model, tok = pooling
    with pytest.raises(InputError) as err:
        parse_target("class:5", model, tok)
    assert str(err.value) == "target class 5 out of range: the model has 2 classes (0..1)"
    with pytest.raises(InputError, match="out of range"):
        parse_target("prob:-1", model, tok)


def test_class_range_is_checked_on_the_output_when_the_model_does_not_declare_it():
    model = track(nn.Linear(3, 2))
    target = parse_target("class:2", model, None)  # nothing declared: checked on the output
    with pytest.raises(InputError, match=r"model has 2 classes \(0\.\.1\)"):
        target(torch.zeros(1, 2), {"input_ids": torch.zeros(1, 3, dtype=torch.long)})


@pytest.mark.parametrize("spec", ["class", "class:", "class:one", "prob:1.5"])
def test_class_needs_an_integer(pooling, spec):
    model, tok = pooling
    with pytest.raises(InputError, match="needs an integer"):
        parse_target(spec, model, tok)


def test_logit_targets_need_logits():
    model, tok = tiny_bert(head=False)
    for spec in ("class:0", "prob:1", "next-token"):
        with pytest.raises(InputError, match="has no output head"):
            parse_target(spec, model, tok)
    batch = dict(tok(["the cat sat"], return_tensors="pt"))
    output = model(**batch)  # a ModelOutput without logits, e.g. from a wrapped model
    bare = parse_target("class:0", nn.Identity(), tok)
    with pytest.raises(InputError, match=r"needs logits, but the model output "
                                         r"\(BaseModelOutputWithPoolingAndCrossAttentions\)"):
        bare(output, batch)
    with pytest.raises(InputError, match="use next-token"):
        bare(torch.zeros(1, 3, 5), batch)  # language-model logits


def test_unknown_kind_lists_the_kinds(pooling):
    model, tok = pooling
    with pytest.raises(InputError) as err:
        parse_target("logit:1", model, tok)
    message = str(err.value)
    assert "\n" not in message and "'logit'" in message
    for kind in TARGET_KINDS.names():
        assert repr(kind) in message
    assert set(TARGET_KINDS.names()) >= {"class", "prob", "next-token", "similarity"}
    with pytest.raises(InputError, match="must be a spec"):
        parse_target(3, model, tok)


def test_next_token_is_fixed_on_the_unperturbed_forward(llama):
    model, tok = llama
    track(model)
    target = parse_target("next-token", model, tok)
    assert target.spec == "next-token" and not target.ready
    for side in ("right", "left"):
        batch = tok(["the cat sat on the", "a dog"], padding_side=side)
        logits = model(**batch)
        last = [5, 2] if side == "right" else [5, 5]  # [BOS] + words; padded to 6
        for row in range(2):
            one = {k: v[row:row + 1] for k, v in batch.items()}
            fixed = target.fixed(logits[row:row + 1], one)
            token = int(logits[row, last[row]].argmax())
            assert fixed.ready and fixed.spec == f"next-token:{token}"
            torch.testing.assert_close(fixed(logits[row:row + 1], one),
                                       logits[row, last[row], token].reshape(1))
        # the fixed target reads the same token at each row's last real position
        both = parse_target(f"next-token:{token}", model, tok)(logits, batch)
        torch.testing.assert_close(both, logits[[0, 1], last, token])
    with pytest.raises(InputError, match="is not fixed yet"):
        target(logits, batch)


def test_next_token_refuses_a_batch_with_different_top_tokens(llama):
    model, tok = llama
    batch = tok(["the cat sat on the", "a dog"])
    logits = model(**batch)
    if int(logits[0, 5].argmax()) == int(logits[1, 2].argmax()):
        pytest.skip("both texts happen to predict the same token")
    with pytest.raises(InputError, match="one text at a time"):
        parse_target("next-token", model, tok).fixed(logits, batch)


def test_next_token_id_must_be_in_the_vocabulary(llama):
    model, tok = llama
    vocab = model.config.vocab_size
    assert parse_target(f"next-token:{vocab - 1}", model, tok).spec == f"next-token:{vocab - 1}"
    for bad in (vocab, -1):
        with pytest.raises(InputError) as err:
            parse_target(f"next-token:{bad}", model, tok)
        assert str(err.value) == (f"next-token id {bad} is outside the vocabulary: the model "
                                  f"has {vocab} tokens (0..{vocab - 1})")


def test_next_token_needs_language_model_logits(pooling):
    model, tok = pooling
    batch = tok(["the cat"])
    target = parse_target("next-token:3", model, tok)
    with pytest.raises(InputError, match=r"needs language-model logits \[batch, seq, vocab\]"):
        target(model(**batch), batch)


def test_similarity_is_cosine_of_masked_mean_pooled_states():
    model, tok = tiny_bert(head=False)
    target = parse_target("similarity: the cat sat ", model, tok)
    assert target.spec == "similarity:the cat sat"
    batch = dict(tok(["the cat sat", "a big red dog ran"], padding=True, return_tensors="pt"))
    with torch.no_grad():
        output = model(**batch)
        values = target(output, batch)
    assert values.shape == (2,)
    assert abs(float(values[0]) - 1.0) < 1e-5  # same text (padded in the batch): cosine 1
    hidden, mask = output.last_hidden_state, batch["attention_mask"]
    pooled = [hidden[i, mask[i] == 1].mean(0) for i in range(2)]
    expected = torch.cosine_similarity(pooled[1], pooled[0], dim=0)
    torch.testing.assert_close(values[1], expected)


@pytest.mark.parametrize("spec", ["similarity", "similarity:", "similarity:   "])
def test_similarity_needs_a_text(spec):
    model, tok = tiny_bert(head=False)
    with pytest.raises(InputError, match="needs a reference text"):
        parse_target(spec, model, tok)


def test_similarity_needs_hidden_states(pooling):
    model, tok = pooling
    with pytest.raises(InputError, match="needs the last hidden state"):
        parse_target("similarity:the cat", model, tok)  # logits [batch, classes]


def test_similarity_of_a_text_with_itself_is_one_on_minilm():
    model, tok = attnprobe.load_model("minilm")
    track(model)
    text = "The cat sat on the mat."
    target = parse_target(f"similarity:{text}", model, tok)
    batch = dict(tok([text, "Stock prices fell sharply."], padding=True, return_tensors="pt"))
    with torch.no_grad():
        values = target(model(**batch), batch)
    assert abs(float(values[0]) - 1.0) < 1e-5
    assert float(values[1]) < 0.5


def test_callables_and_targets():
    target = parse_target(lambda output, inputs: output.sum(-1), None, None)
    assert isinstance(target, Target) and target.spec == "custom" and target.ready
    batch = {"input_ids": torch.zeros(2, 3, dtype=torch.long)}
    torch.testing.assert_close(target(torch.ones(2, 4), batch), torch.full((2,), 4.0))
    assert parse_target(target, None, None) is target
    bad = parse_target(lambda output, inputs: output, None, None)
    with pytest.raises(InputError, match=r"returned shape \(2, 4\); a target returns one "
                                         r"scalar per example, shape \[2\]"):
        bad(torch.ones(2, 4), batch)
    with pytest.raises(InputError, match="returned float"):
        parse_target(lambda output, inputs: 1.0, None, None)(torch.ones(2, 4), batch)
