"""Forward-based analyses (extract, census, compare, perturb, generation, diff) on models loaded
the ways big models are — offloaded over CPU + disk, bf16, int8 weights — against the plain
float32 model (issue 27). Tolerances are derived in ``docs/guide/big-models.md`` and next to
each constant here.

- offloaded float32: the same kernels in the same order, so every table is *equal*;
- int8 (optimum-quanto): equal, to float32 rounding, to the float32 twin whose weights are the
  dequantized int8 values (the int8 forward multiplies by exactly those values);
- bf16: within a bound derived from bf16's unit roundoff ``u = 2^-8`` and the depth.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import transformers

import attnprobe as ap
from tests.big_models import (
    FAMILIES,
    INT8_FAMILIES,
    assert_unchanged,
    dequantized_twin,
    load,
    sample_text,
    save_family,
    snapshot,
)
from tests.conftest import track
from tests.helpers import bert_tokenizer, bert_vocab

pytestmark = pytest.mark.filterwarnings("ignore")

U_BF16 = 2.0 ** -8  # bf16 unit roundoff: 8 significant bits
EPS_F32 = 2.0 ** -24  # float32 unit roundoff
# bf16 roundings a score meets per layer before the softmax: the layer's input (normed hidden
# state), the q/k projection weights, the projected q and k, the score itself.
ROUNDINGS_PER_LAYER = 5


def texts_of(family: str) -> list[str]:
    return [sample_text(family, 6), sample_text(family, 5, 3)]


# perturb reads every family's logits as a language model's ("auto" cannot tell what a masked
# LM returns)
OUTPUT = "lm"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, object]:
    return {family: save_family(family, tmp_path_factory.mktemp(family)) for family in FAMILIES}


@pytest.fixture(scope="module")
def models(folders, tmp_path_factory):
    """``models(family, kind)``: loaded once per module."""
    cache: dict[tuple[str, str], tuple] = {}

    def get(family: str, kind: str):
        if (family, kind) not in cache:
            off = tmp_path_factory.mktemp(f"off-{family}") if kind == "offload" else None
            cache[family, kind] = load(folders[family], kind, off)
        return cache[family, kind]
    return get


@pytest.fixture(scope="module")
def plain_tables(models):
    """``plain_tables(family)``: :func:`tables` of the plain float32 model, computed once."""
    cache: dict[str, dict[str, object]] = {}

    def get(family: str) -> dict[str, object]:
        if family not in cache:
            cache[family] = tables(family, *models(family, "fp32"))
        return cache[family]
    return get


def tables(family: str, model, tok) -> dict[str, object]:
    """Every forward-based table of the module on ``texts_of(family)``."""
    texts = texts_of(family)
    out = OUTPUT
    return {
        "extract": ap.extract(model, tok, texts),
        "census": ap.heads.census(model, tok, texts).scores(),
        "compare": ap.attribution.compare(
            model, tok, texts[:1], "next-token", methods=["saliency", "integrated_gradients"],
            views=["raw"], n_steps=8).table,
        "uniform": ap.perturb.run(model, tok, texts, "uniform", output=out),
        "permute": ap.perturb.run(model, tok, texts, "permute", n_permutations=2, seed=0,
                                  output=out),
        "ablate": ap.perturb.run(model, tok, texts, "ablate", output=out),
        "ablate_heads": ap.perturb.run(model, tok, texts, "ablate", sweep="head", output=out),
    }


def float_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if pd.api.types.is_float_dtype(frame[c])]


# ------------------------------------------------------------------ offloaded: exactly equal
@pytest.mark.parametrize("family", FAMILIES)
def test_offloaded_tables_equal_plain_exactly(family, models, plain_tables):
    plain = plain_tables(family)
    model, tok = models(family, "offload")
    assert {"cpu", "disk"} <= set(model.hf_device_map.values())
    before = snapshot(model)
    found = tables(family, model, tok)
    for a, b in zip(plain["extract"], found["extract"], strict=True):
        assert b.pattern.device.type == "cpu" and b.pattern.dtype == torch.float32
        assert torch.equal(a.pattern, b.pattern)
    for name in plain.keys() - {"extract"}:
        pd.testing.assert_frame_equal(plain[name], found[name], check_exact=True, obj=name)
    assert_unchanged(model, before)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_offloaded_generation_and_diff_equal_plain(family, folders, models, tmp_path):
    texts = texts_of(family)
    plain, tok = models(family, "fp32")
    model, _ = models(family, "offload")
    before = snapshot(model)
    a = ap.extract(plain, tok, texts, generate=3)
    b = ap.extract(model, tok, texts, generate=3)
    for x, y in zip(a, b, strict=True):
        assert x.query_ids == y.query_ids and x.prompt_length == y.prompt_length
        assert torch.equal(x.pattern, y.pattern)
    other = save_family(family, tmp_path / "seed1", seed=1)
    other_plain, _ = load(other, "fp32")
    other_off, _ = load(other, "offload", tmp_path / "off1")
    kw = dict(repeated=False, similarity=False)
    expected = ap.heads.diff(plain, other_plain, tok, texts, **kw).scores()
    found = ap.heads.diff(model, other_off, tok, texts, **kw).scores()
    pd.testing.assert_frame_equal(expected, found, check_exact=True)
    assert_unchanged(model, before)


# ------------------------------------------------------------ int8: equal to the fp32 twin
@pytest.mark.parametrize("family", INT8_FAMILIES)
def test_int8_tables_equal_dequantized_twin(family, folders, models):
    model, tok = models(family, "int8")
    twin = dequantized_twin(folders[family], model)
    before = snapshot(model)
    expected, found = tables(family, twin, tok), tables(family, model, tok)
    # The same float32 values are multiplied; only the matmul kernel may differ. A float32
    # dot product of d terms is off by <= d·eps·Σ|terms| (Higham's γ_d), so a score by
    # δ = (L + 1)·d·eps·S through the L layers and the head (S: the scores' size, bounded
    # as in bf16_score_error); every table value moves by <= 2δ (tvd: two rows, each <= δ).
    layers, d = model.config.num_hidden_layers, model.config.hidden_size
    tol = 2 * (layers + 1) * d * EPS_F32 * score_spread(expected["extract"])
    for a, b in zip(expected["extract"], found["extract"], strict=True):
        torch.testing.assert_close(b.pattern, a.pattern, rtol=0, atol=tol)
    for name in expected.keys() - {"extract"}:
        pd.testing.assert_frame_equal(expected[name], found[name], check_exact=False,
                                      rtol=0, atol=tol, obj=name)
    assert_unchanged(model, before)


# ------------------------------------------------------------------------------------ bf16
def bf16_score_error(spread: float, n_layers: int) -> float:
    """``δ``, a bound on how far a bf16 score (softmax input) is from the float32 one.

    Each score is rounded ``ROUNDINGS_PER_LAYER`` times in its own layer, and the error of
    every layer below enters through the residual stream, so to first order it is off by
    ``δ = ROUNDINGS_PER_LAYER · (n_layers + 1) · u · S``, ``S`` the size of the scores. The
    tiny models' q/k have no bias and zero-mean weights, so their scores are centred and the
    row's spread ``max log p − min log p`` (which is ``max s − min s``) bounds ``|s|``.

    A softmax whose inputs move by at most ``δ`` moves, to first order, weight ``j`` by
    ``p_j (ds_j − Σ_i p_i ds_i)``, at most ``2 p_j (1 − p_j) δ <= δ/2``; a row by at most
    ``δ`` in total variation (so any mass over a set of keys moves by at most ``δ``); and
    its entropy by ``|Σ_j ln p_j dp_j| <= 2δ Σ_j p_j |ln p_j| = 2δ·H``.
    """
    return ROUNDINGS_PER_LAYER * (n_layers + 1) * U_BF16 * spread


def score_spread(maps) -> float:
    """The largest spread ``max log p − min log p`` of a row over its visible keys."""
    spread = 0.0
    for amap in maps:
        p = amap.pattern.double()
        logs = torch.where(p > 0, p.log(), torch.nan)
        rows = logs.nan_to_num(-torch.inf).amax(-1) - logs.nan_to_num(torch.inf).amin(-1)
        spread = max(spread, float(rows.max()))
    return spread


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_maps_and_census_within_bf16_tolerance(family, models):
    texts = texts_of(family)
    plain, tok = models(family, "fp32")
    model, _ = models(family, "bf16")
    before = snapshot(model)
    expected = ap.extract(plain, tok, texts)
    found = ap.extract(model, tok, texts)
    delta = bf16_score_error(score_spread(expected), plain.config.num_hidden_layers)
    for a, b in zip(expected, found, strict=True):
        # on the CPU, float32, holding the bf16 weights the model computed (nothing invented)
        assert b.pattern.device.type == "cpu" and b.pattern.dtype == torch.float32
        assert torch.equal(b.pattern, b.pattern.bfloat16().float())
        assert b.info.dtype == "bfloat16"  # the precision it was computed in
        torch.testing.assert_close(b.pattern, a.pattern, rtol=0, atol=delta / 2)
    a = ap.heads.census(plain, tok, texts).scores()
    b = ap.heads.census(model, tok, texts).scores()
    assert all(b[c].dtype == np.float64 for c in float_columns(a))
    masses = ["max_weight", "prev", "self", "next", "first", "chance_weight"]
    # means over rows of a mass (max_weight: the mass of one key) and of the entropy
    np.testing.assert_allclose(b[masses], a[masses], rtol=0, atol=delta)
    assert ((b["entropy"] - a["entropy"]).abs() <= 2 * delta * a["entropy"]).all()
    assert_unchanged(model, before)


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_perturb_and_compare_tables_are_float_and_close(family, models, plain_tables):
    plain, tok = models(family, "fp32")
    model, _ = models(family, "bf16")
    expected, found = plain_tables(family), tables(family, model, tok)
    ids = tok(texts_of(family), return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = plain(**ids).logits.double()
    spread = float((logits.amax(-1) - logits.amin(-1)).max())
    # the output distribution is a softmax row too, its logits one layer (the head) deeper
    delta = bf16_score_error(spread, plain.config.num_hidden_layers + 1)
    for name in ("uniform", "ablate", "ablate_heads", "permute", "compare"):
        a, b = expected[name], found[name]
        assert len(a) == len(b)
        assert all(b[c].dtype == np.float64 for c in float_columns(a)), name
        assert np.isfinite(b["value" if name == "compare" else "perturbed"].to_numpy(
            float)).all()
    for name in ("uniform", "ablate", "ablate_heads"):
        a, b = expected[name], found[name]
        # top_prob is one weight of the output row (moves <= δ/2); tvd a distance between
        # two rows, each of which moves by at most δ in total variation
        for metric, bound in (("top_prob", delta / 2), ("tvd", 2 * delta)):
            rows = a["metric"] == metric
            np.testing.assert_allclose(b.loc[rows, "perturbed"], a.loc[rows, "perturbed"],
                                       rtol=0, atol=bound, err_msg=f"{name} {metric}")


# ------------------------------------------------- census accumulation on a long bf16 input
def test_bf16_census_accumulates_long_rows_in_float32():
    """A BERT without queries (query weight and bias 0) attends uniformly: each of the ``n``
    rows holds ``n`` weights ``p = bf16(1/n)``, so every row's entropy is ``−n·p·ln p`` and
    so is the census's mean ``entropy``. Summed in float32 (and averaged in float64) it is
    off by at most ``n·eps32·ln n`` (Higham's γ_n over a row of ``n`` terms, ~4e-4 here);
    an entropy kept in bf16 is off by up to half its ulp (2^-6 at ln 1000 ≈ 6.9), the same
    for every row, so the mean keeps the whole error."""
    n = 1000
    vocab = bert_vocab()
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=n, initializer_range=0.3)
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    with torch.no_grad():
        for layer in model.encoder.layer:
            layer.attention.self.query.weight.zero_()
            layer.attention.self.query.bias.zero_()
    model = track(model.to(torch.bfloat16))
    tok = bert_tokenizer(vocab)
    text = sample_text("bert", n - 2)  # + [CLS] and [SEP]: n tokens
    assert len(tok(text)["input_ids"]) == n
    scores = ap.heads.census(model, tok, [text], repeated=False, similarity=False).scores()
    p = torch.tensor(1 / n, dtype=torch.bfloat16).double()
    expected = float(-n * p * p.log())
    assert scores["entropy"].dtype == np.float64
    np.testing.assert_allclose(scores["entropy"], expected, rtol=0,
                               atol=n * EPS_F32 * math.log(n))


# -------------------------------------------------- Integrated Gradients on a bf16 model
def test_bf16_integrated_gradients_sum_the_path_in_float32(models):
    """IG on the input embeddings of the bf16 LLaMA equals the path integral computed here
    independently: the same Gauss–Legendre points ``e_b + α(e_x − e_b)`` (bf16, one batched
    forward as the method runs them), their bf16 gradients, summed in float64 with the
    rule's weights and multiplied by the exact ``e_x − e_b``. Accumulated in float32 the
    two differ by at most ``(n + d + 2)·eps32·M`` per token (γ over the n steps, the d
    hidden units and two products; ``M = Σ_k Σ_h w_k |g_kh (e_x − e_b)_h|``); a bf16 sum or
    a bf16 ``e_x − e_b`` is off by up to ``u·M``, 2^16 times more."""
    from attnprobe.attribution.gradient_methods import IntegratedGradients

    model, tok = models("llama", "bf16")
    n_steps, token = 16, 7
    text = sample_text("llama", 5)

    def target(output, inputs):
        return output.logits[:, -1, token].float()

    found = ap.attribution.attribute(model, tok, [text], target,
                                     [IntegratedGradients(n_steps=n_steps)])[0]
    ids = tok(text, return_tensors="pt")["input_ids"]
    base = torch.where(ids == tok.bos_token_id, ids, torch.full_like(ids, tok.pad_token_id))
    embed = model.get_input_embeddings()
    with torch.no_grad():
        e_x, e_b = embed(ids), embed(base)
    nodes, weights = np.polynomial.legendre.leggauss(n_steps)
    alphas, weights = (nodes + 1) / 2, weights / 2
    points = torch.cat([e_b + float(a) * (e_x - e_b) for a in alphas]).requires_grad_()
    handle = embed.register_forward_hook(lambda _m, _i, _o: points)
    try:
        logits = model(input_ids=ids.expand(n_steps, -1),
                       attention_mask=torch.ones(n_steps, ids.shape[1], dtype=torch.long)).logits
    finally:
        handle.remove()
    (grads,) = torch.autograd.grad(logits[:, -1, token].float().sum(), points)
    terms = (torch.as_tensor(weights)[:, None, None] * grads.double()
             * (e_x.double() - e_b.double()))  # [step, token, hidden]
    expected = terms.sum(dim=(0, 2))
    bound = (n_steps + model.config.hidden_size + 2) * EPS_F32 * terms.abs().sum(dim=(0, 2))
    assert found.scores.dtype == torch.float64
    assert bool(((found.scores - expected).abs() <= bound).all()), \
        (found.scores - expected).abs() / terms.abs().sum(dim=(0, 2))


def test_bf16_integrated_gradients_completeness(models):
    """Completeness ``Σ attributions ≈ f(x) − f(b)`` on the bf16 LLaMA, to the float32
    model's own gap (the quadrature error of the same path and rule) plus what bf16 adds:
    ``f(x)`` and ``f(b)`` and every gradient computed through ``L + 1`` rounded layers
    (the LM head included), each off by ``ε = ROUNDINGS_PER_LAYER·(L + 1)·u`` relative, so
    the gap moves by at most ``ε·(|f(x)| + |f(b)| + Σ|attributions|)``; the float32 sum
    over the ``n`` steps adds ``n·eps32`` of that, negligible (a bf16 sum would add ``n·u``)."""
    from attnprobe.attribution.gradient_methods import IntegratedGradients

    n_steps, token = 64, 7
    text = sample_text("llama", 5)

    def target(output, inputs):
        return output.logits[:, -1, token].float()

    runs = {}
    for kind in ("fp32", "bf16"):
        model, tok = models("llama", kind)
        runs[kind] = ap.attribution.attribute(model, tok, [text], target,
                                              [IntegratedGradients(n_steps=n_steps)])[0]
    model, tok = models("llama", "bf16")
    ids = tok(text, return_tensors="pt")["input_ids"]
    base = torch.where(ids == tok.bos_token_id, ids, torch.full_like(ids, tok.pad_token_id))
    with torch.no_grad():
        f_x, f_b = (float(target(model(input_ids=i), None)) for i in (ids, base))
    found = runs["bf16"]
    gap = abs(float(found.scores.sum()) - (f_x - f_b))
    assert gap == pytest.approx(found.delta, rel=1e-4, abs=1e-6)  # the reported delta
    eps = ROUNDINGS_PER_LAYER * (model.config.num_hidden_layers + 1) * U_BF16
    scale = abs(f_x) + abs(f_b) + float(found.scores.abs().sum())
    bound = runs["fp32"].delta + (eps + n_steps * EPS_F32) * scale
    assert gap <= bound, (gap, bound)


# ------------------------------------------------------- a failure in the middle restores
class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_failure_mid_analysis_leaves_offloaded_model_unchanged(family, models, plain_tables):
    """A metric (perturb) or a target (compare) that raises inside the forward loop: the
    error propagates, and the model keeps its weights, attention implementation and
    accelerate offload hooks (no hook of ours: the autouse guard); the next run gives the
    plain model's table again."""
    model, tok = models(family, "offload")
    before = snapshot(model)
    texts = texts_of(family)

    calls = []

    def metric(output, batch):  # the baseline reads, the perturbed forward's read raises
        calls.append(1)
        if len(calls) > 1:
            raise Boom("metric")
        return output.logits[:, -1, 0].float()

    def target(output, inputs):
        raise Boom("target")

    with pytest.raises(Boom):
        ap.perturb.run(model, tok, texts[:1], "uniform", metric=metric)
    assert len(calls) == 2  # it failed in the middle, after the baseline forward
    with pytest.raises(Boom):
        ap.attribution.compare(model, tok, texts[:1], target, methods=["saliency"],
                               views=["raw"])
    assert_unchanged(model, before)
    again = ap.perturb.run(model, tok, texts, "uniform", output=OUTPUT)
    pd.testing.assert_frame_equal(again, plain_tables(family)["uniform"], check_exact=True)


# ------------------------------------------- views that read weights: norm (Kobayashi et al.)
@pytest.mark.parametrize("view", ["norm", "alti"])
@pytest.mark.parametrize("family", FAMILIES)
def test_weight_reading_views_on_offloaded_and_int8_models(family, view, folders, models):
    """The norm view ``α_ij·‖f(x_j)‖`` and ALTI read the attention output projection's weight
    (ALTI also a post-norm's weight and bias): read through the offload hook (they wait on
    the meta device between forwards) they give the plain model's scores exactly; an int8
    weight is read dequantized, as the twin's plain weight is."""
    text = texts_of(family)[:1]

    def norm_scores(model, tok):
        return ap.attribution.compare(model, tok, text, "next-token", methods=["saliency"],
                                      views=[view]).table

    plain, tok = models(family, "fp32")
    model, _ = models(family, "offload")
    before = snapshot(model)
    pd.testing.assert_frame_equal(norm_scores(plain, tok), norm_scores(model, tok),
                                  check_exact=True)
    assert_unchanged(model, before)
    if family in INT8_FAMILIES:
        quantized, _ = models(family, "int8")
        twin = dequantized_twin(folders[family], quantized)
        pd.testing.assert_frame_equal(norm_scores(twin, tok), norm_scores(quantized, tok),
                                      check_exact=True)


# ------------------------------------------------------------------- ALTI on a bf16 model
@pytest.mark.parametrize("family", FAMILIES)
def test_alti_decomposes_bf16_layers_to_bf16_rounding(family, models):
    """ALTI rebuilds each layer's output in float64 from the very weights, values and
    residual the bf16 layer used; the layer's own output differs from that by its roundings
    (α·v, the output projection, the residual sum, post-norm the norm's output: <= 5, each
    <= u relative to the largest entry), so the relative gap is <= 5u — far above the
    float32 check (1e-4) that a bf16 model used to fail, far below a missing term's O(1)."""
    from attnprobe.attribution.alti import alti_layers

    model, tok = models(family, "bf16")
    found, _ = alti_layers(model, tok, texts_of(family)[0])
    assert found and all(0 < one.gap <= 5 * U_BF16 for one in found)
    table = ap.attribution.compare(model, tok, texts_of(family)[:1], "next-token",
                                   methods=["saliency"], views=["alti"]).table
    assert np.isfinite(table["value"].to_numpy(float)).all()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_offloaded_faithfulness_equals_plain_exactly(family, models):
    """The erasure leaderboard pools perturbed inputs into padded batches: on the offloaded
    model the same batches run the same kernels, so every row is the plain model's."""
    texts = texts_of(family)

    def evaluate(kind: str) -> pd.DataFrame:
        model, tok = models(family, kind)
        return ap.faithfulness.evaluate(model, tok, texts, "next-token", views=["raw"],
                                        methods=["saliency"], levels=(0.2, 0.5),
                                        curve_steps=3, seed=1).table
    pd.testing.assert_frame_equal(evaluate("offload"), evaluate("fp32"), check_exact=True)
