"""Direct logit attribution: where a head's value bias goes (issue 24, item 22) and a model in
training mode (item 15).

``value_bias="head"`` (the default) keeps ``b_V[h] @ W_O[h]`` in head ``h`` (what the head
writes); ``"output"`` is TransformerLens' default (``fold_value_biases``): per-head terms read
``z`` without ``b_V`` and the layer's ``attn_bias`` row gets ``Σ_h b_V[h] @ W_O[h]``. Totals
agree; the per-head numbers under ``"output"`` equal an independent computation from the
weights here (attention recomputed from ``c_attn``, ``z`` without ``b_V`` times ``W_O``,
through the final LayerNorm frozen at the run's σ)."""

from __future__ import annotations

import pytest
import torch

import attnprobe as ap
from attnprobe.heads.direct_logits import logit_attribution
from tests.integration.causal_lms import causal_lm, text
from tests.unit.heads.test_logit_attribution import with_biases

TEXTS = [text(5, 6, 7, 8, 9), text(10, 11, 12)]
TOKEN = 20  # the metric: logit:w20 at each text's last token


@pytest.fixture(scope="module")
def gpt2():
    model, tok = causal_lm("gpt2")
    return with_biases(model), tok


def gpt2_heads_without_value_bias(model, ids: list[int]) -> torch.Tensor:
    """``[layer, head]``: each head's ``(z − b_V) @ W_O`` at the last token, through the frozen
    final LayerNorm, on the unembedding row of :data:`TOKEN` (float64)."""
    seen = {}
    hooks = [b.ln_1.register_forward_hook(
        lambda m, a, o, i=i: seen.__setitem__(i, o[0].double()))
        for i, b in enumerate(model.transformer.h)]
    hooks.append(model.transformer.ln_f.register_forward_hook(
        lambda m, a, o: seen.__setitem__("resid", a[0][0].double())))
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    cfg = model.config
    d, n = cfg.n_embd, cfg.n_head
    dh = d // n
    resid = seen["resid"][-1]
    ln_f = model.transformer.ln_f
    sigma = (resid.var(unbiased=False) + ln_f.eps).sqrt()
    readout = model.lm_head.weight[TOKEN].double() * ln_f.weight.double()
    readout = readout - readout.mean()  # centring a component == centring the readout
    out = torch.zeros(cfg.n_layer, n, dtype=torch.float64)
    causal = torch.ones(len(ids), len(ids)).tril().bool()
    for layer, block in enumerate(model.transformer.h):
        x = seen[layer]  # [seq, d_model]
        W, b = block.attn.c_attn.weight.double(), block.attn.c_attn.bias.double()
        q, k = (x @ W[:, :d] + b[:d]), (x @ W[:, d:2 * d] + b[d:2 * d])
        v = x @ W[:, 2 * d:]  # no value bias
        W_O = block.attn.c_proj.weight.double()  # [d_model (heads' z), d_model]
        for h in range(n):
            part = slice(h * dh, (h + 1) * dh)
            scores = (q[:, part] @ k[:, part].T) / dh ** 0.5
            pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
            z = pattern[-1] @ v[:, part]  # [d_head] at the last token
            out[layer, h] = (z @ W_O[part]) @ readout / sigma
    return out


def test_totals_agree_and_the_output_convention_moves_b_V_into_the_bias_row(gpt2):
    model, tok = gpt2
    head = logit_attribution(model, tok, TEXTS, f"logit:w{TOKEN}")
    folded = logit_attribution(model, tok, TEXTS, f"logit:w{TOKEN}", value_bias="output")
    assert (head.value_bias, folded.value_bias) == ("head", "output")
    assert folded.totals["components"].tolist() == pytest.approx(
        head.totals["components"].tolist(), abs=1e-9)
    assert folded.totals["value"].tolist() == head.totals["value"].tolist()
    a, b = head.table.set_index(["example_id", "component"]), \
        folded.table.set_index(["example_id", "component"])
    for layer in range(2):  # what leaves the heads arrives in the layer's bias row
        names = [f"L{layer}H{h}" for h in range(4)]
        moved = (a.loc[(slice(None), names), "value"].groupby("example_id").sum()
                 - b.loc[(slice(None), names), "value"].groupby("example_id").sum())
        gained = (b.xs(f"L{layer}.attn_bias", level="component")["value"]
                  - a.xs(f"L{layer}.attn_bias", level="component")["value"])
        assert moved.tolist() == pytest.approx(gained.tolist(), abs=1e-9)
        assert moved.abs().max() > 1e-3  # the biases are set: the conventions differ


def test_per_head_values_under_the_output_convention_are_z_without_b_V_through_W_O(gpt2):
    model, tok = gpt2
    folded = logit_attribution(model, tok, TEXTS, f"logit:w{TOKEN}", value_bias="output")
    for b, sentence in enumerate(TEXTS):
        with torch.no_grad():
            want = gpt2_heads_without_value_bias(model, tok(sentence)["input_ids"])
        rows = folded.table[(folded.table["example_id"] == str(b))
                            & (folded.table["kind"] == "head")]
        got = torch.zeros_like(want)
        for r in rows.itertuples():
            got[int(r.layer), int(r.head)] = r.value
        # the model ran in float32, this recomputation in float64: at most one float32
        # rounding per term of a d_model-long dot product, at the logits' scale
        scale = max(float(want.abs().max()), 1.0)
        atol = model.config.n_embd * torch.finfo(torch.float32).eps * scale
        torch.testing.assert_close(got, want, atol=atol, rtol=0)


def test_without_a_value_bias_both_conventions_are_equal():
    model, tok = causal_lm("llama")
    head = logit_attribution(model, tok, TEXTS, f"logit:w{TOKEN}")
    folded = logit_attribution(model, tok, TEXTS, f"logit:w{TOKEN}", value_bias="output")
    assert head.table["value"].tolist() == folded.table["value"].tolist()


def test_an_unknown_convention_is_refused(gpt2):
    model, tok = gpt2
    with pytest.raises(ap.InputError, match=r"value_bias.*'head', 'output'") as err:
        logit_attribution(model, tok, TEXTS, f"logit:w{TOKEN}", value_bias="tl")
    assert "\n" not in str(err.value)


def test_a_model_in_training_mode_is_told_to_call_eval():
    model, tok = causal_lm("gpt2")
    model.train()
    try:
        with pytest.raises(ap.InputError, match=r"training mode.*call model\.eval\(\)") as err:
            logit_attribution(model, tok, TEXTS, f"logit:w{TOKEN}")
    finally:
        model.eval()
    assert "\n" not in str(err.value) and "adapter" not in str(err.value)
