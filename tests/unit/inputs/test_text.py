"""The text -> batch path: a batch may mix sentence pairs (a tab) and single texts."""

from __future__ import annotations

import pytest
import torch

import attnprobe as ap
from attnprobe.inputs.text import encode, pad_rows, token_rows
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert

TEXTS = ["the cat\ta dog", "the mat", "red\tbig red cat"]


@pytest.fixture
def bert():
    vocab = bert_vocab()
    return tiny_bert(vocab), bert_tokenizer(vocab)


@pytest.mark.parametrize("side", ("right", "left"))
def test_a_batch_mixing_pairs_and_single_texts_pads_each_as_encoded_alone(bert, side):
    model, tok = bert
    batch = encode(model, tok, TEXTS, padding_side=side)
    assert batch["input_ids"].shape == (3, 7)  # [CLS] red [SEP] big red cat [SEP]
    for i, text in enumerate(TEXTS):
        alone = encode(model, tok, [text])["input_ids"][0]
        real = batch["attention_mask"][i].bool()
        assert torch.equal(batch["input_ids"][i][real], alone)
        assert int(real.sum()) == len(alone)
        first_real = int(real.nonzero()[0])
        assert first_real == (0 if side == "right" else 7 - len(alone))
    assert tok.convert_ids_to_tokens(encode(model, tok, TEXTS[:1])["input_ids"][0]) == [
        "[CLS]", "the", "cat", "[SEP]", "a", "dog", "[SEP]"]


def test_extract_of_a_mixed_batch_equals_one_text_at_a_time(bert):
    model, tok = bert
    together = ap.extract(model, tok, TEXTS, batch_size=3)
    for text, amap in zip(TEXTS, together, strict=True):
        alone = ap.extract(model, tok, [text])[0]
        assert amap.query_tokens == alone.query_tokens
        assert (amap.pattern - alone.pattern).abs().max().item() <= 1e-6


@pytest.mark.parametrize("texts", [["the cat\ta dog"], TEXTS])
def test_sentence_pairs_keep_their_segment_ids(bert, texts):
    """BERT tells the halves of a pair apart by token_type_ids: 0 up to the first [SEP], 1
    after; the maps are those of the model given the pair the tokenizer's own way."""
    model, tok = bert
    batch = encode(model, tok, texts)
    ids, types = batch["input_ids"][0], batch["token_type_ids"][0]
    first_sep = int((ids == tok.sep_token_id).nonzero()[0])
    n_real = int(batch["attention_mask"][0].sum())
    assert types[: first_sep + 1].eq(0).all() and types[first_sep + 1:n_real].eq(1).all()
    amap = ap.extract(model, tok, texts)[0]
    hand = dict(tok("the cat", "a dog", return_tensors="pt"))
    with torch.no_grad(), ap.capture(model) as cap:
        model(**hand)
    assert torch.allclose(amap.pattern, cap.maps[0].pattern, atol=1e-6)  # padding: float noise
    del hand["token_type_ids"]  # the segment ids change the weights of this model
    with torch.no_grad(), ap.capture(model) as one_segment:
        model(**hand)
    assert not torch.allclose(amap.pattern, one_segment.maps[0].pattern)


@pytest.mark.parametrize("side", ("right", "left"))
def test_rows_tokenized_once_pad_into_the_batch_encode_makes(bert, side):
    """The census tokenizes each text once, when it plans its batches, and pads those rows
    later: the batch must be the one ``encode`` builds (segment ids of pairs included)."""
    model, tok = bert
    rows = token_rows(tok, TEXTS, model=model)
    assert [len(row.ids) for row in rows] == [7, 4, 7]
    padded = pad_rows(model, tok, rows, padding_side=side)
    encoded = encode(model, tok, TEXTS, padding_side=side)
    assert padded.keys() == encoded.keys() == {"input_ids", "attention_mask", "token_type_ids"}
    for name, tensor in encoded.items():
        assert torch.equal(padded[name], tensor), name
