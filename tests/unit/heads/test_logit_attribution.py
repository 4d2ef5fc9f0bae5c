"""Direct logit attribution (docs/guide/causal-methods.md): the components sum to the metric
read off the model's own logits (≤ 1e-4 on tiny GPT-2, LLaMA and Qwen2 configs with every
bias set), a head's value equals its output recomputed from the captured pattern and the
weights through the frozen final norm, scopes keep the sum, and every refusal is one line."""

from __future__ import annotations

import inspect

import pandas as pd
import pytest
import torch
import transformers

import attnprobe as ap
from attnprobe.capture import count_hooks
from attnprobe.errors import InputError
from attnprobe.heads.direct_logits import COLUMNS, TOTAL_COLUMNS, logit_attribution
from attnprobe.models.decoder_only import LlamaConfig, LlamaModel
from attnprobe.models.tokenizer import WordTokenizer
from attnprobe.weights.anatomy import DecompositionError, anatomy
from tests.conftest import track
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert
from tests.integration.causal_lms import causal_lm, text

TEXTS = [text(5, 6, 7, 8, 9), text(10, 11, 12), text(20, 21, 22, 23, 24, 25, 26, 27)]


def with_biases(model: torch.nn.Module) -> torch.nn.Module:
    """Every parameter nudged, so zero-initialised biases (attention output, LayerNorm) are
    not zero and their rows matter."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
    return model


@pytest.fixture(scope="module", params=["gpt2", "llama", "qwen2"])
def lm(request):
    model, tok = causal_lm(request.param)
    return with_biases(model), tok


def own_logits(model, tok, texts):
    """The model's logits and its batch, right-padded as attnprobe pads (no attnprobe code
    reads them)."""
    rows = [tok(t)["input_ids"] for t in texts]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, :len(row)] = torch.tensor(row)
        mask[b, :len(row)] = 1
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    return logits, ids, mask


def test_components_sum_to_the_models_own_next_token_logits(lm):
    model, tok = lm
    result = logit_attribution(model, tok, TEXTS, "logit:next", metric_positions="all")
    logits, ids, mask = own_logits(model, tok, TEXTS)
    assert list(result.table.columns) == COLUMNS
    assert list(result.totals.columns) == TOTAL_COLUMNS
    sums = result.table.groupby("example_id", sort=False)["value"].sum()
    for b in range(len(TEXTS)):
        n = int(mask[b].sum())
        expected = logits[b, torch.arange(n - 1), ids[b, 1:n]].double().mean()
        assert sums[str(b)] == pytest.approx(float(expected), abs=1e-4, rel=1e-4)
    kinds = set(result.table["kind"])
    assert {"embed", "head", "mlp"} <= kinds
    if anatomy(model).family == "gpt2":  # LayerNorm bias and attention output biases
        assert {"norm_bias", "L0.attn_bias", "L1.attn_bias"} <= set(result.table["component"])


def test_logit_difference_is_the_difference_of_two_logits(lm):
    model, tok = lm
    diff = logit_attribution(model, tok, TEXTS, "logit_diff:w5,w6", metric_positions="all")
    first = logit_attribution(model, tok, TEXTS, "logit:w5", metric_positions="all")
    second = logit_attribution(model, tok, TEXTS, "logit:w6", metric_positions="all")
    logits, _, mask = own_logits(model, tok, TEXTS)
    for b in range(len(TEXTS)):
        n = int(mask[b].sum())
        want = (logits[b, :n, 5] - logits[b, :n, 6]).double().mean()
        got = diff.table[diff.table["example_id"] == str(b)]["value"].sum()
        assert got == pytest.approx(float(want), abs=1e-4, rel=1e-4)
    merged = first.table.merge(second.table, on=["example_id", "position", "component"])
    assert torch.allclose(torch.tensor(diff.table["value"].to_numpy()),
                          torch.tensor((merged["value_x"] - merged["value_y"]).to_numpy()),
                          atol=1e-9)


def test_next_token_is_fixed_on_the_run_and_decomposed(lm):
    model, tok = lm
    result = logit_attribution(model, tok, TEXTS, "next-token")
    logits, _, mask = own_logits(model, tok, TEXTS)
    for b in range(len(TEXTS)):
        last = logits[b, int(mask[b].sum()) - 1]
        assert result.totals["value"][b] == pytest.approx(float(last.max()), abs=1e-4)
        got = result.table[result.table["example_id"] == str(b)]["value"].sum()
        assert got == pytest.approx(float(last.max()), abs=1e-4, rel=1e-4)
    assert result.totals["metric"].str.startswith("next-token:").all()


def test_a_scope_lists_its_heads_and_sums_the_rest_per_layer(lm):
    model, tok = lm
    full = logit_attribution(model, tok, TEXTS, "logit:next", metric_positions="all")
    part = logit_attribution(model, tok, TEXTS, "logit:next", metric_positions="all",
                             scope="heads:0.1,1.2")
    assert sorted(set(part.table.loc[part.table["kind"] == "head", "component"])) == \
        ["L0H1", "L1H2"]
    for layer, kept in ((0, 1), (1, 2)):
        others = full.table[(full.table["kind"] == "head") & (full.table["layer"] == layer)
                            & (full.table["head"] != kept)]
        rest = part.table[part.table["component"] == f"L{layer}.rest"]
        assert rest["value"].sum() == pytest.approx(others["value"].sum(), abs=1e-9)
    assert part.table["value"].sum() == pytest.approx(full.table["value"].sum(), abs=1e-9)
    assert part.by_head().isna().sum().sum() == 6


def test_shared_corpus_signature():
    params = inspect.signature(ap.heads.logit_attribution).parameters
    assert list(params)[:4] == ["model", "tokenizer", "texts", "metric"]
    # the corpus options are one CorpusOptions (tests/unit/test_signature.py), its own
    # options keyword-only with their defaults
    for name, default in {"corpus": None, "metric_positions": "last"}.items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert params[name].default == default, name


# ----------------------------------------------------------------------------- by hand
@pytest.fixture(scope="module")
def toy():
    """A 1-layer attention-only LLaMA-style reference model with 4 heads on 2 KV heads."""
    tok = WordTokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = LlamaModel(LlamaConfig(len(tok), d_model=16, n_layers=1, n_heads=4,
                                       n_kv_heads=2, attention_only=True)).eval()
        with torch.no_grad():
            model.norm.weight.uniform_(0.5, 1.5)
            model.blocks[0].norm1.weight.uniform_(0.5, 1.5)
    return track(model), tok


def test_a_heads_value_is_its_output_through_the_frozen_final_norm(toy):
    model, tok = toy
    sentence = "the cat sat on the mat"
    result = logit_attribution(model, tok, [sentence], "logit:dog", metric_positions="all")
    # independently: the pattern from the capture seam, v and W_O from the weights, the
    # residual from a plain hook on the final norm
    amap = ap.extract(model, tok, [sentence])[0]
    ids = torch.as_tensor(tok([sentence])["input_ids"])  # [1, seq]
    seen = {}
    handle = model.norm.register_forward_hook(lambda m, a, o: seen.update(resid=a[0][0]))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        handle.remove()
    block, attn = model.blocks[0], model.blocks[0].attn
    with torch.no_grad():
        x = block.norm1(model.embed(ids))[0]  # [seq, d_model]
        v = attn.v_proj(x).view(len(x), attn.n_kv_heads, attn.d_head)
        resid = seen["resid"]
        scale = (resid.pow(2).mean(-1, keepdim=True) + model.norm.eps).sqrt()  # [seq, 1]
        readout = model.unembed.weight[tok.convert_tokens_to_ids(["dog"])[0]] * model.norm.weight
        for h in range(4):
            z = amap.pattern[0, h] @ v[:, h // 2]  # [seq, d_head]
            out = z @ attn.out_proj.weight[:, h * attn.d_head:(h + 1) * attn.d_head].T
            want = ((out / scale) @ readout) / len(x)  # the metric is a mean over positions
            got = result.table[result.table["component"] == f"L0H{h}"].sort_values("position")
            assert torch.allclose(torch.tensor(got["value"].to_numpy()), want.double(),
                                  atol=1e-6)


def test_a_residual_piece_the_adapter_does_not_see_is_an_error_not_a_wrong_table(toy):
    model, tok = toy
    extra = torch.ones(model.config.d_model)
    handle = model.blocks[0].register_forward_hook(lambda m, a, out: out + extra)
    try:
        with pytest.raises(DecompositionError, match="parts of the residual stream") as err:
            logit_attribution(model, tok, ["the cat sat"], "logit:dog")
    finally:
        handle.remove()
    assert "\n" not in str(err.value)
    assert count_hooks(model) == 0


def test_hooks_are_removed_when_the_forward_raises(toy):
    model, tok = toy

    def boom(module, args):
        raise RuntimeError("boom")
    handle = model.blocks[0].attn.register_forward_pre_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            logit_attribution(model, tok, ["the cat sat"], "logit:dog")
        assert count_hooks(model) == 1  # only the test's own
    finally:
        handle.remove()


def test_corpus_positions_are_cut_per_batch(toy):
    model, tok = toy
    texts = ["the cat sat on the mat", "a dog ran", "the dog sat on a mat"]
    lists = [[1, 2], [0], [3, 5]]
    width = max(len(tok([t])["input_ids"][0]) for t in texts)  # as wide as the inputs
    mask = torch.zeros(3, width, dtype=torch.bool)
    for b, wanted in enumerate(lists):
        mask[b, wanted] = True
    by_lists = logit_attribution(model, tok, texts, "logit:dog", metric_positions=lists,
                                 batch_size=2)
    by_mask = logit_attribution(model, tok, texts, "logit:dog", metric_positions=mask,
                                batch_size=1)
    whole = logit_attribution(model, tok, texts, "logit:dog", metric_positions=lists,
                              batch_size=3)
    for other in (by_mask, whole):
        assert by_lists.table["value"].to_numpy() == pytest.approx(other.table["value"]
                                                                   .to_numpy(), abs=1e-9)
    assert sorted(by_lists.table.groupby("example_id")["position"].unique().map(list)
                  .tolist()) == sorted(lists)


def test_repr_is_one_line_and_html_names_the_heads(toy):
    model, tok = toy
    result = logit_attribution(model, tok, ["the cat sat", "a dog"], "logit:dog")
    text_ = repr(result)
    assert text_.startswith("LogitAttribution(") and "\n" not in text_
    assert "2 examples" in text_ and "1 layer × 4 heads" in text_
    html = result._repr_html_()
    assert html is None or "L0H3" in html


# ----------------------------------------------------------------------------- refusals
def test_post_norm_bert_is_refused_with_one_line():
    vocab = bert_vocab()
    with pytest.raises(InputError, match="post-norm") as err:
        logit_attribution(tiny_bert(vocab), bert_tokenizer(vocab), ["the cat"], "logit:cat")
    assert "\n" not in str(err.value) and "re-normalised" in str(err.value)


def test_a_metric_not_linear_in_the_logits_is_refused(toy):
    model, tok = toy
    for spec in ("prob:dog", "loss", lambda output, batch: output[:, -1, 0]):
        with pytest.raises(InputError, match="not a sum of logits"):
            logit_attribution(model, tok, ["the cat sat"], spec)


def test_a_model_without_an_lm_head_is_refused():
    lm_model, tok = causal_lm("gpt2")
    base = track(transformers.GPT2Model(lm_model.config).eval())
    with pytest.raises(InputError, match="no unembedding"):
        logit_attribution(base, tok, [text(5, 6)], "logit:w5")


def test_an_unknown_layout_is_refused_naming_what_is_supported():
    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)

        def forward(self, input_ids, attention_mask=None):
            return self.embed(input_ids)
    with pytest.raises(InputError, match="supported: GPT-2"):
        logit_attribution(track(Plain()), None, [[1, 2]], "logit:1")


def test_a_bad_scope_is_refused(toy):
    model, tok = toy
    with pytest.raises(InputError, match="out of range"):
        logit_attribution(model, tok, ["the cat"], "logit:dog", scope="head:0.7")


# ----------------------------------------------------------------------------- other families
def family(config_class, model_class, **extra):
    from tests.integration.hf_models import _decoder_kwargs

    torch.manual_seed(0)
    config = config_class(**{**_decoder_kwargs(), **extra})
    return track(with_biases(model_class(config).eval()))


def test_gemmas_scaled_embeddings_and_one_plus_weight_norms_still_sum_exactly():
    model = family(transformers.GemmaConfig, transformers.GemmaForCausalLM, head_dim=8)
    _, tok = causal_lm("llama")
    result = logit_attribution(model, tok, TEXTS, "logit:next", metric_positions="all")
    logits, ids, mask = own_logits(model, tok, TEXTS)
    for b in range(len(TEXTS)):
        n = int(mask[b].sum())
        expected = logits[b, torch.arange(n - 1), ids[b, 1:n]].double().mean()
        got = result.table[result.table["example_id"] == str(b)]["value"].sum()
        assert got == pytest.approx(float(expected), abs=1e-4, rel=1e-4)


@pytest.mark.parametrize(("config_class", "model_class", "extra", "match"), [
    ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 8}, "more norms"),
    ("GraniteConfig", "GraniteForCausalLM", {"residual_multiplier": 0.5}, "residual_multiplier"),
])
def test_layers_that_rescale_what_they_add_are_refused(config_class, model_class, extra, match):
    model = family(getattr(transformers, config_class), getattr(transformers, model_class),
                   **extra)
    with pytest.raises(InputError, match=match) as err:
        logit_attribution(model, causal_lm("llama")[1], [text(5, 6)], "logit:w5")
    assert "\n" not in str(err.value)


def test_the_notebook_view_escapes_every_string():
    from attnprobe.heads.direct_logits import LogitAttribution
    from tests.unit.report.test_notebook import EVIL, assert_safe

    table = pd.DataFrame({"example_id": [EVIL] * 2, "position": [0, 0],
                          "component": ["embed", "L0H0"], "kind": ["embed", "head"],
                          "layer": pd.array([None, 0], "Int64"),
                          "head": pd.array([None, 0], "Int64"), "metric": EVIL,
                          "value": [1.0, 2.0]})
    totals = pd.DataFrame({"example_id": [EVIL], "metric": [EVIL], "value": [3.0],
                           "components": [3.0], "gap": [0.0]})
    html = LogitAttribution(table, totals, EVIL, "reference", 1, 1)._repr_html_()
    assert_safe(html)
    assert "L0H0" in html
