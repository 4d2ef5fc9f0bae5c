"""``attention_importance``'s default (every registered view) adapts to the model and the call:
a view the model's family cannot serve, or one that needs a target when none is given, is left
out; a view named by the caller is never dropped (it is refused with one line)."""

from __future__ import annotations

import pytest
import torch
import transformers

from attnprobe.attribution.view_base import VIEWS
from attnprobe.attribution.views import attention_importance
from attnprobe.errors import InputError
from tests.conftest import track
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert

TEXT = "the cat sat on a mat"


def first_hidden(output, inputs):
    return output.last_hidden_state[:, 0, 0]


def tiny_opt(n_tok: int) -> transformers.OPTModel:
    """A family that none of the views that run their own model code knows (norm, value
    zeroing, ALTI), while the map views and attention × gradient read any captured model."""
    torch.manual_seed(0)
    return track(transformers.OPTModel(transformers.OPTConfig(
        vocab_size=n_tok, hidden_size=16, num_hidden_layers=2, ffn_dim=32,
        num_attention_heads=2, word_embed_proj_dim=16, max_position_embeddings=32)).eval())


def refused_by(model) -> set[str]:
    refused = set()
    for name in VIEWS.names():
        try:
            VIEWS.get(name)().check(model)
        except InputError:
            refused.add(name)
    return refused


def test_default_views_leave_out_the_views_the_family_cannot_serve():
    tok = bert_tokenizer(bert_vocab())
    opt = tiny_opt(len(tok))
    refused = refused_by(opt)
    assert {"norm", "value_zeroing", "alti"} <= refused and "raw" not in refused
    found = attention_importance(opt, tok, TEXT, first_hidden)
    assert {a.method.partition("@")[0] for a in found} == set(VIEWS.names()) - refused
    one = attention_importance(opt, tok, TEXT, first_hidden, views=["raw"])
    assert torch.equal(next(a for a in found if a.method == one[-1].method).scores,
                       one[-1].scores)
    for name in ("value_zeroing", "alti"):  # named by the caller: refused, not dropped
        with pytest.raises(InputError, match="opt") as caught:
            attention_importance(opt, tok, TEXT, views=["raw", name])
        assert "\n" not in str(caught.value)


def test_default_views_without_a_target_leave_out_the_target_views():
    vocab = bert_vocab()
    tok = bert_tokenizer(vocab)
    model = track(tiny_bert(vocab).eval())
    found = attention_importance(model, tok, TEXT)
    wanted = {name for name in VIEWS.names() if not VIEWS.get(name).needs_target}
    assert "attn_x_grad" not in wanted and {"value_zeroing", "alti"} <= wanted
    assert {a.method.partition("@")[0] for a in found} == wanted
    with pytest.raises(InputError, match="needs a target"):
        attention_importance(model, tok, TEXT, views=["raw", "attn_x_grad"])
