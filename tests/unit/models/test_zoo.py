"""Every reference model in the zoo: buildable by name, listed, captured, and hook-clean."""

import pytest
import torch

import attnprobe as ap
from attnprobe.cli import main
from attnprobe.models import REFERENCE_MODELS
from tests.conftest import track

TEXTS = ["the cat sat on the mat", "a dog ran"]
NO_ATTENTION = {"rnn-seq2seq"}  # the fixed-context baseline has nothing to capture


def inputs(model, tok):
    batch = tok(TEXTS)
    if getattr(model.config, "is_encoder_decoder", False):
        target = tok(["a cat", "the dog ran home"])
        batch = {**batch, "decoder_input_ids": target["input_ids"],
                 "decoder_attention_mask": target["attention_mask"]}
    return batch


@pytest.mark.parametrize("name", REFERENCE_MODELS.names())
def test_every_model_is_captured(name):
    model, tok = ap.load_model(f"ref:{name}")
    model = track(model)
    assert model.attnprobe_name == name
    batch = inputs(model, tok)
    if name in NO_ATTENTION:
        with pytest.raises(ap.AttentionUnavailableError), ap.capture(model):
            model(**batch)
        return
    with torch.no_grad():
        plain = model(**batch)
        with ap.capture(model, tokenizer=tok) as cap:
            captured = model(**batch)
    assert torch.allclose(plain, captured, atol=1e-5)  # capture changes nothing
    lengths = batch["attention_mask"].sum(-1).tolist()
    for amap in cap.maps:
        n_layers = amap.shape[0]
        assert n_layers == len(amap.layers) >= 1
        assert torch.allclose(amap.pattern.sum(-1), torch.ones(()), atol=1e-5)
        assert amap.shape[3] in lengths or amap.kind == "self"
    kinds = {m.kind for m in cap.maps}
    assert kinds <= {"self", "cross"}
    if getattr(model.config, "is_encoder_decoder", False):
        assert "cross" in kinds


@pytest.mark.parametrize("name", sorted(set(REFERENCE_MODELS.names()) - NO_ATTENTION))
def test_every_model_works_through_extract(name):
    model, tok = ap.load_model(f"ref:{name}")
    maps = ap.extract(track(model), tok, TEXTS)
    assert maps and all(m.info.name == name for m in maps)


def test_cli_lists_every_model(capsys):
    main(["models"])
    out = capsys.readouterr().out
    for name in REFERENCE_MODELS.names():
        assert f"ref:{name}" in out
