"""Residual-stream and MLP-output patching (``ap.patch.residual`` / ``ap.patch.mlp``) against
one patched forward per (layer, position), done by plain torch hooks written here:

- ``resid_pre``: a pre-hook on block ``l`` setting its input at ``p``;
- ``resid_post``: a hook on block ``l`` setting its output at ``p``;
- ``resid_mid``: set through the MLP side (the library goes through the attention output):
  the MLP's pre-norm reads the other run's residual at ``p``, and the MLP's output carries
  ``other − base`` so the block's sum holds it too;
- ``mlp_out``: a hook on the MLP setting its output at ``p``.

The metric is the logit of a token resolved by hand, read from the logits. Plus the checks by
construction (first ``resid_pre`` at every position = the other run; last ``resid_post`` at
the metric's position = the other run's metric) and the one-line refusals.
"""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import pytest
import torch

import attnprobe as ap
from tests.conftest import track
from tests.integration.causal_lms import causal_lm
from tests.unit.patch.inputs import batch_of

CLEAN = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16], [40, 41, 42, 43, 44, 45]]
CORRUPT = [[25, 26, 27, 8, 9, 10], [31, 32, 13, 34, 15, 16], [40, 51, 42, 53, 44, 45]]
TOLERANCE = dict(rtol=1e-5, atol=1e-5)  # float32 logits of batches of other sizes


def _reference_llama():
    model, _ = ap.load_model("ref:llama")
    return track(model)


# name -> (model, token id of the metric, blocks, the MLP's pre-norm name, the MLP's name)
def models(name: str):
    if name == "ref:llama":
        model = _reference_llama()
        return model, None, model.blocks, "norm2", "mlp"
    model, tok = causal_lm(name)
    blocks = model.transformer.h if name == "gpt2" else model.model.layers
    norm = "ln_2" if name == "gpt2" else "post_attention_layernorm"
    return model, tok, blocks, norm, "mlp"


def _ids(rows, tok):
    """The id rows as given (token ids are not re-tokenized), after ``[BOS]`` (2) for the
    reference model, which expects it first."""
    return [[2, *row] for row in rows] if tok is None else rows


def _token(tok) -> tuple[str, int]:
    if tok is None:  # the reference models' word tokenizer: ids are the spec
        return "logit:20", 20
    return "logit:w20", tok.convert_tokens_to_ids("w20")


def _hidden(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


def _first(output):
    return output[0] if isinstance(output, tuple) else output


def _record(model, blocks, norm, mlp, inputs):
    """Per layer the block input, the MLP's pre-norm input, the MLP output and the block
    output ``[batch, seq, d_model]`` of one run."""
    found = {"resid_pre": {}, "resid_mid": {}, "mlp_out": {}, "resid_post": {}}
    with ExitStack() as stack:
        for layer, block in enumerate(blocks):
            def pre(m, args, kwargs, layer=layer):
                found["resid_pre"][layer] = _hidden(args, kwargs).clone()

            def mid(m, args, layer=layer):
                found["resid_mid"][layer] = args[0].clone()

            def out(m, args, output, layer=layer):
                found["mlp_out"][layer] = _first(output).clone()

            def post(m, args, output, layer=layer):
                found["resid_post"][layer] = _first(output).clone()
            for handle in (block.register_forward_pre_hook(pre, with_kwargs=True),
                           getattr(block, norm).register_forward_pre_hook(mid),
                           getattr(block, mlp).register_forward_hook(out),
                           block.register_forward_hook(post)):
                stack.callback(handle.remove)
        with torch.no_grad():
            model(**inputs)
    return found


def _patched_once(model, blocks, norm, mlp, inputs, site, layer, position, value):
    """The logits of ``inputs`` with ``site`` of ``layer`` at ``position`` (None: every
    position) set to ``value`` ``[batch, seq, d_model]``: one forward, one patch."""
    at = slice(None) if position is None else position
    block = blocks[layer]
    handles = []
    if site == "resid_pre":
        def set_input(m, args, kwargs):
            hidden = _hidden(args, kwargs).clone()
            hidden[:, at] = value[:, at]
            return ((hidden, *args[1:]), kwargs) if args else \
                (args, {**kwargs, "hidden_states": hidden})
        handles.append(block.register_forward_pre_hook(set_input, with_kwargs=True))
    elif site in ("resid_post", "mlp_out"):
        def set_output(m, args, output):
            hidden = _first(output).clone()
            hidden[:, at] = value[:, at]
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden
        module = block if site == "resid_post" else getattr(block, mlp)
        handles.append(module.register_forward_hook(set_output))
    else:  # resid_mid, through the MLP's side
        seen = {}

        def set_norm_input(m, args):
            seen["mid"] = args[0]
            hidden = args[0].clone()
            hidden[:, at] = value[:, at]
            return (hidden, *args[1:])

        def carry(m, args, output):
            return output + (value - seen["mid"]) * _mask(value, at)
        handles.append(getattr(block, norm).register_forward_pre_hook(set_norm_input))
        handles.append(getattr(block, mlp).register_forward_hook(carry))
    try:
        with torch.no_grad():
            output = model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return output if isinstance(output, torch.Tensor) else output.logits


def _mask(value, at):
    mask = torch.zeros((*value.shape[:2], 1), dtype=value.dtype)
    mask[:, at] = 1
    return mask


def _table(model, tok, site, **kw):
    spec, _ = _token(tok)
    clean, corrupt = _ids(CLEAN, tok), _ids(CORRUPT, tok)
    if site == "mlp_out":
        return ap.patch.mlp(model, tok if tok is not None else _word_tok(), clean, corrupt,
                            spec, **kw)
    return ap.patch.residual(model, tok if tok is not None else _word_tok(), clean, corrupt,
                             spec, stream=site, **kw)


def _word_tok():
    return ap.load_model("ref:llama")[1]


@pytest.mark.parametrize("name", ["gpt2", "llama", "ref:llama"])
@pytest.mark.parametrize("site", ["resid_pre", "resid_mid", "resid_post", "mlp_out"])
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_each_layer_and_position_equals_one_patched_forward(name, site, direction):
    model, tok, blocks, norm, mlp = models(name)
    _, token = _token(tok)
    base, other = batch_of(_ids(CORRUPT, tok)), batch_of(_ids(CLEAN, tok))
    if direction == "noising":
        base, other = other, base
    # batch_size 7: two examples' repetitions per forward, chunks across layers
    table = _table(model, tok, site, direction=direction, batch_size=7)
    source = _record(model, blocks, norm, mlp, other)[site]
    n_layers, width = len(blocks), base["input_ids"].shape[1]
    assert len(table) == n_layers * width * len(CLEAN)
    assert table["head"].isna().all() and set(table["site"]) == {site}
    for layer in range(n_layers):
        for position in range(width):
            logits = _patched_once(model, blocks, norm, mlp, base, site, layer, position,
                                   source[layer])
            want = logits[:, -1, token].double().numpy()
            got = table[(table["layer"] == layer) & (table["position"] == position)]
            np.testing.assert_allclose(got.sort_values("example_id")["patched"], want,
                                       **TOLERANCE, err_msg=f"{site} L{layer} p{position}")


@pytest.mark.parametrize("name", ["gpt2", "llama", "ref:llama"])
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_first_resid_pre_at_every_position_is_the_other_run(name, direction):
    """The whole input of the first block from the other run: effect 1 for every example."""
    model, tok, *_ = models(name)
    table = _table(model, tok, "resid_pre", scope="layer:0", positions="all",
                   direction=direction)
    assert len(table) == len(CLEAN) and table["position"].isna().all()
    other = table["clean" if direction == "denoising" else "corrupt"]
    np.testing.assert_allclose(table["patched"], other, **TOLERANCE)
    np.testing.assert_allclose(table["effect"], 1.0, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_last_resid_post_restores_the_metric_only_at_its_position(name):
    """The metric reads the last position: the last block's output there is all the logits
    see (effect 1); elsewhere a causal model's last layer reaches nothing (effect 0)."""
    model, tok, blocks, *_ = models(name)
    last = len(blocks) - 1
    table = _table(model, tok, "resid_post", scope=f"layer:{last}")
    width = len(_ids(CLEAN, tok)[0])
    at_metric = table[table["position"] == width - 1]
    np.testing.assert_allclose(at_metric["patched"], at_metric["clean"], **TOLERANCE)
    np.testing.assert_allclose(at_metric["effect"], 1.0, rtol=0, atol=1e-4)
    before = table[table["position"] < width - 1]
    np.testing.assert_allclose(before["patched"], before["corrupt"], **TOLERANCE)


def test_bert_serves_resid_pre_and_post_and_refuses_the_pre_norm_sites():
    from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert

    vocab = bert_vocab()
    model = track(tiny_bert(vocab).eval())
    tok = bert_tokenizer(vocab)
    clean, corrupt = ["the cat sat"], ["the dog sat"]

    def metric(out, batch):
        return out.last_hidden_state[:, 0, 0]

    table = ap.patch.residual(model, tok, clean, corrupt, metric, scope="layer:0",
                              positions="all")
    np.testing.assert_allclose(table["effect"], 1.0, rtol=0, atol=1e-4)
    table = ap.patch.residual(model, tok, clean, corrupt, metric, stream="resid_post")
    last = table[table["layer"] == table["layer"].max()]
    # the metric reads [CLS] of the last layer's output: only position 0 of it matters
    np.testing.assert_allclose(last[last["position"] == 0]["effect"], 1.0, rtol=0, atol=1e-4)
    np.testing.assert_allclose(last[last["position"] > 0]["effect"], 0.0, rtol=0, atol=1e-4)
    for call in (lambda: ap.patch.residual(model, tok, clean, corrupt, metric,
                                           stream="resid_mid"),
                 lambda: ap.patch.mlp(model, tok, clean, corrupt, metric)):
        with pytest.raises(ap.InputError, match=r"pre-norm.*post-norm") as caught:
            call()
        assert "\n" not in str(caught.value)


def test_refusals_are_one_line():
    model, tok, *_ = models("gpt2")
    clean, corrupt = _ids(CLEAN, tok), _ids(CORRUPT, tok)
    with pytest.raises(ap.InputError, match="covers whole layers"):
        ap.patch.residual(model, tok, clean, corrupt, "logit:w20", scope="head:0.1")
    with pytest.raises(ap.InputError, match="unknown stream 'mlp_out'"):
        ap.patch.residual(model, tok, clean, corrupt, "logit:w20", stream="mlp_out")
    with pytest.raises(ap.InputError, match="takes"):
        ap.patch.run(model, tok, clean, corrupt, "logit:w20", "mlp", site="output")
    from attnprobe.models.decoder_only import LlamaConfig, LlamaModel

    attention_only = track(LlamaModel(LlamaConfig(
        64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, attention_only=True)).eval())
    with pytest.raises(ap.InputError, match="no MLP"):
        ap.patch.mlp(attention_only, _word_tok(), [[2, 5, 6]], [[2, 7, 6]], "logit:5")
