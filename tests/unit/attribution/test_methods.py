"""Attribution methods: values known by construction, Captum's contracts on a tiny BERT, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attnprobe.attribution.methods import (
    DEFAULT_METHODS,
    METHODS,
    GradientShap,
    IntegratedGradients,
    attribute,
)
from attnprobe.attribution.targets import parse_target
from attnprobe.capture import count_hooks
from attnprobe.errors import InputError
from attnprobe.models.tokenizer import WordTokenizer
from tests.conftest import track
from tests.helpers import tiny_bert_classifier

TEXT = "the cat saw the dog and the bird"  # 'the' three times


class BagOfEmbeddings(nn.Module):
    """``logits = W · Σ_i mask_i e_i + b``: linear in the embeddings, so Integrated Gradients
    equals (input − baseline) × gradient exactly and deleting a token removes its term."""

    def __init__(self, vocab_size: int, d: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d)
        self.out = nn.Linear(d, 2)

    def forward(self, input_ids, attention_mask=None):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        states = self.embed(input_ids) * mask.unsqueeze(-1)  # [batch, seq, d]
        return self.out(states.sum(1))  # [batch, 2]


class CountSquared(nn.Module):
    """``logit = (number of real tokens equal to `token`)²``; no embedding, no parameter."""

    def __init__(self, token: int) -> None:
        super().__init__()
        self.token = token

    def forward(self, input_ids, attention_mask=None):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        count = ((input_ids == self.token) & (mask != 0)).sum(-1).float()
        return (count ** 2).unsqueeze(-1)  # [batch, 1]


@pytest.fixture
def bag():
    tok = WordTokenizer()
    return track(BagOfEmbeddings(len(tok)).eval()), tok


def by_method(results):
    return {r.method: r for r in results}


def test_linear_model_values_by_construction(bag):
    model, tok = bag
    ids = tok([TEXT])["input_ids"][0]  # [BOS] + 8 words
    e = model.embed.weight.detach()[ids]  # [seq, d]
    w = model.out.weight.detach()[1]
    e_pad, e_unk = model.embed.weight.detach()[tok.pad_token_id], \
        model.embed.weight.detach()[tok.unk_token_id]
    # attn_lrp has rules for transformer families only: it refuses this model (test_attn_lrp)
    names = [name for name in METHODS.names() if name != "attn_lrp"]
    out = by_method(attribute(model, tok, [TEXT], "class:1", names, n_steps=8))
    assert set(out) == set(names)
    assert all(r.tokens == ("[BOS]", *TEXT.split()) for r in out.values())
    real = slice(1, None)  # [BOS] is special: kept in the baseline, never deleted

    ig = out["integrated_gradients"].scores
    assert ig[0] == 0
    torch.testing.assert_close(ig[real], ((e[real] - e_pad) @ w).double(), atol=1e-5, rtol=0)
    baseline = ids.clone()
    baseline[real] = tok.pad_token_id
    with torch.no_grad():
        f_x = model(ids[None])[0, 1]
        f_b = model(baseline[None])[0, 1]
    assert abs(float(ig.sum()) - float(f_x - f_b)) < 1e-5  # completeness
    assert out["integrated_gradients"].delta < 1e-5

    torch.testing.assert_close(out["saliency"].scores, w.norm().double().expand(len(ids)))
    torch.testing.assert_close(out["input_x_gradient"].scores, (e @ w).double(), atol=1e-6,
                               rtol=0)
    loo = out["leave_one_out"].scores
    assert loo[0] == 0
    torch.testing.assert_close(loo[real], (e[real] @ w).double(), atol=1e-5, rtol=0)
    occ = out["occlusion"].scores
    torch.testing.assert_close(occ[real], ((e[real] - e_unk) @ w).double(), atol=1e-5, rtol=0)

    # GradientSHAP on a linear model: w·(e_i − b_i) averaged over the drawn baselines, i.e.
    # w·e_i − p·w·e_pad with one share p of pad-embedding draws for every token
    shap = out["gradient_shap"].scores
    assert shap[0] == 0
    gap = (e[real] @ w).double() - shap[real]
    p = gap / float(e_pad @ w)
    torch.testing.assert_close(p, p[0].expand_as(p), atol=1e-5, rtol=0)
    assert -1e-6 <= float(p[0]) <= 1 + 1e-6


def test_counting_model_perturbations_give_the_exact_effect():
    tok = WordTokenizer()
    the = tok.convert_tokens_to_ids(["the"])[0]
    model = track(CountSquared(the).eval())
    out = by_method(attribute(model, tok, [TEXT], "class:0", ["leave_one_out", "occlusion"],
                              batch_size=3))
    expected = torch.tensor([0.0] + [5.0 if w == "the" else 0.0 for w in TEXT.split()],
                            dtype=torch.float64)  # 3² − 2² for each 'the'
    torch.testing.assert_close(out["leave_one_out"].scores, expected)
    torch.testing.assert_close(out["occlusion"].scores, expected)
    with pytest.raises(InputError, match="no input embedding layer found in CountSquared"):
        attribute(model, tok, [TEXT], "class:0", ["saliency"])


def test_results_one_per_text_and_method(bag):
    model, tok = bag
    texts = ["the cat sat", "a dog ran on the mat"]
    results = attribute(model, tok, texts, "prob:0",
                        ["saliency", IntegratedGradients(n_steps=4)])
    assert [(r.example_id, r.method) for r in results] == [
        ("0", "saliency"), ("0", "integrated_gradients"),
        ("1", "saliency"), ("1", "integrated_gradients")]
    assert {r.target for r in results} == {"prob:0"}
    frame = results[3].to_frame()
    assert list(frame["token"]) == ["[BOS]", "a", "dog", "ran", "on", "the", "mat"]
    assert DEFAULT_METHODS == ("integrated_gradients", "saliency", "input_x_gradient",
                               "gradient_shap", "leave_one_out")


def test_embedding_can_be_named(bag):
    model, tok = bag
    default = attribute(model, tok, ["the cat sat"], "class:0", ["saliency"])[0]
    named = attribute(model, tok, ["the cat sat"], "class:0", ["saliency"], embedding="embed")[0]
    torch.testing.assert_close(default.scores, named.scores)
    with pytest.raises(InputError, match="'nope' is not a module path"):
        attribute(model, tok, ["the cat sat"], "class:0", ["saliency"], embedding="nope")


def test_gradient_shap_is_seeded_and_leaves_global_rng_alone(bag):
    model, tok = bag
    torch_state, np_state = torch.get_rng_state(), np.random.get_state()
    runs = [attribute(model, tok, [TEXT], "class:1", [GradientShap(n_samples=4, seed=s)])[0]
            for s in (3, 3, 4)]
    torch.testing.assert_close(runs[0].scores, runs[1].scores, atol=0, rtol=0)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.random.get_state()[1].tolist() == np_state[1].tolist()


# ---------------------------------------------------------------------------- tiny BERT
@pytest.fixture
def bert():
    return tiny_bert_classifier()


def test_bert_integrated_gradients_converges_and_chunks_exactly(bert):
    model, tok = bert
    text = "the big cat sat on a red mat"
    fine = attribute(model, tok, [text], "class:1", ["integrated_gradients"], n_steps=300)[0]
    expected = tok.convert_ids_to_tokens(tok(text)["input_ids"])
    assert list(fine.tokens) == expected and expected[0] == "[CLS]"
    assert fine.scores[0] == 0 and fine.scores[-1] == 0  # [CLS], [SEP] kept in the baseline
    total = float(fine.scores.sum())
    assert abs(total) > 1e-2
    assert fine.delta < 1e-3 * abs(total)
    coarse = attribute(model, tok, [text], "class:1", ["integrated_gradients"], n_steps=2)[0]
    assert coarse.delta > fine.delta

    whole = attribute(model, tok, [text], "class:1", ["integrated_gradients"], n_steps=20)[0]
    chunked = attribute(model, tok, [text], "class:1", ["integrated_gradients"], n_steps=20,
                        internal_batch_size=7)[0]
    torch.testing.assert_close(chunked.scores, whole.scores, atol=1e-5, rtol=0)


def test_bert_every_method_runs_and_leaves_no_hook(bert):
    model, tok = bert
    results = attribute(model, tok, ["the cat sat", "a dog ran"], "class:0", METHODS.names(),
                        n_steps=4, batch_size=2)
    assert len(results) == 2 * len(METHODS)
    assert count_hooks(model) == 0
    loo = by_method(results[:len(METHODS)])["leave_one_out"].scores
    assert loo[0] == 0 and loo[-1] == 0 and bool((loo[1:-1] != 0).all())


def test_hooks_are_removed_when_the_target_fails_midway(bert):
    model, tok = bert

    def only_single(output, inputs):  # fine on the unperturbed forward, fails on IG's batch
        if output.logits.shape[0] > 1:
            raise RuntimeError("boom")
        return output.logits[:, 0]

    with pytest.raises(RuntimeError, match="boom"):
        attribute(model, tok, ["the cat sat"], only_single, ["integrated_gradients"], n_steps=4)
    assert count_hooks(model) == 0


def test_deeplift_breaks_completeness_on_bert(bert):
    """Why ``deeplift`` is not in METHODS: Captum's rules only replace its supported
    nonlinear modules (ReLU, Sigmoid, ...); BERT's GELU module, functional softmax and
    LayerNorm fall back to plain gradients, so the scores do not sum to f(x) − f(baseline)
    (Integrated Gradients does, to ~1e-6)."""
    model, tok = bert
    captum = pytest.importorskip("captum.attr")
    target = parse_target("class:1", model, tok)
    batch = tok(["the big cat sat on a red mat"], return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    baseline = ids.clone()
    baseline[0, 1:-1] = tok.pad_token_id

    class Wrapped(nn.Module):  # DeepLift needs an nn.Module returning [batch]
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask)
            return target(out, {"input_ids": input_ids, "attention_mask": attention_mask})

    wrapped = track(Wrapped())
    _, delta = captum.LayerDeepLift(wrapped, model.get_input_embeddings()).attribute(
        ids, baselines=baseline, additional_forward_args=(mask,),
        return_convergence_delta=True)
    with torch.no_grad():
        gap = float(wrapped(ids, mask) - wrapped(baseline, mask))
    assert abs(float(delta)) > 1e-2 * abs(gap)
    ig = attribute(model, tok, ["the big cat sat on a red mat"], target,
                   ["integrated_gradients"], n_steps=50)[0]
    assert ig.delta < 1e-4 * abs(gap)
    assert "deeplift" not in METHODS


# ---------------------------------------------------------------------------- bad input
def test_works_under_no_grad(bag):
    model, tok = bag
    plain = attribute(model, tok, ["the cat"], "class:0", ["saliency", "integrated_gradients"])
    with torch.no_grad():
        inside = attribute(model, tok, ["the cat"], "class:0",
                           ["saliency", "integrated_gradients"])
    for a, b in zip(plain, inside, strict=True):
        torch.testing.assert_close(a.scores, b.scores)


def test_inference_mode_is_refused(bag):
    model, tok = bag
    with torch.inference_mode(), pytest.raises(InputError) as err:
        attribute(model, tok, ["the cat"], "class:0", ["saliency"])
    assert str(err.value) == ("attribution needs gradients: call it outside "
                              "torch.inference_mode()")


def test_training_mode_is_refused(bag):
    model, tok = bag
    model.train()
    with pytest.raises(InputError) as err:
        attribute(model, tok, ["the cat"], "class:0", ["saliency"])
    assert str(err.value) == "dropout makes attributions random: call model.eval()"


def test_unknown_method_lists_the_methods(bag):
    model, tok = bag
    with pytest.raises(InputError) as err:
        attribute(model, tok, ["the cat"], "class:0", ["saliency", "deeplift"])
    message = str(err.value)
    assert "'deeplift'" in message and "\n" not in message
    assert all(repr(name) in message for name in METHODS.names())


def test_cost_over_budget_names_what_to_lower(bag):
    model, tok = bag
    with pytest.raises(InputError, match=r"integrated_gradients would run 5,010 "
                                         r"token-forwards on text 1 \(10 tokens\), over "
                                         r"budget=5,000: lower n_steps, shorten the text"):
        attribute(model, tok, ["the cat", "the cat saw the dog and the bird ran"], "class:0",
                  ["integrated_gradients"], n_steps=499, budget=5000)
    with pytest.raises(InputError, match=r"leave_one_out would run 90 token-forwards .*: "
                                         r"shorten the text"):
        attribute(model, tok, ["the cat saw the dog and the bird ran"], "class:0",
                  ["leave_one_out"], budget=89)


@pytest.mark.parametrize(("texts", "options", "message"), [
    ([], {}, "no text given"),
    (["the cat", "  "], {}, "text 1 is empty"),
    (["the cat"], {"n_steps": 0}, "n_steps must be a positive integer"),
    (["the cat"], {"batch_size": -1}, "batch_size must be a positive integer"),
    (["the cat"], {"methods": []}, "at least one attribution method"),
])
def test_bad_arguments(bag, texts, options, message):
    model, tok = bag
    options = {"methods": ["saliency", "leave_one_out"], **options}
    with pytest.raises(InputError, match=message):
        attribute(model, tok, texts, "class:0", **options)
