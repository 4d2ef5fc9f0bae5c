"""``perturbed()`` on reference and tiny transformers models: the edit reaches the output, is
checked to take effect, touches only its scope, matches hand-made ablations, and leaves
nothing behind."""

from __future__ import annotations

import pytest
import torch
import transformers

from attnprobe.capture import count_hooks
from attnprobe.core.scope import Scope
from attnprobe.errors import (
    AttentionUnavailableError,
    EditNotAppliedError,
    HookNotFiredError,
    InputError,
)
from attnprobe.models import build_reference
from attnprobe.perturb.context import head_output_means, perturbed
from attnprobe.perturb.interventions import Dirichlet, Erase, Mean, Permute, Uniform, Zero
from tests import helpers
from tests.conftest import track
from tests.helpers import bert_tokenizer, bert_vocab

VOCAB = bert_vocab("the cat sat on mat a dog ran")
TEXTS = ["the cat sat on the mat", "a dog ran"]


@pytest.fixture(scope="module")
def tokenizer():
    return bert_tokenizer(VOCAB)


def tiny_bert(implementation: str = "sdpa") -> transformers.BertModel:
    return helpers.tiny_bert(VOCAB, implementation)


def tiny_gpt2() -> transformers.GPT2Model:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=20, n_embd=16, n_layer=2, n_head=2,
                                     n_positions=32, initializer_range=0.3)
    return track(transformers.GPT2Model(config).eval())


@pytest.fixture
def ref():
    model, tok = build_reference("transformer")  # causal, 2 layers x 4 heads (GQA)
    return track(model), tok


def self_attention_hook(model, layer, replace):
    """Plain forward hook on ``encoder.layer[i].attention.self``: its first output is the
    concatenated per-head output ``[batch, query, head * d_head]`` before the projection."""
    module = model.encoder.layer[layer].attention.self

    def hook(mod, args, output):
        return (replace(output[0]), *output[1:])

    return module.register_forward_hook(hook)


# ----------------------------------------------------------------------------- reference models
def test_uniform_on_a_reference_model_changes_logits_and_keeps_masks(ref):
    model, tok = ref
    batch = tok(TEXTS, padding_side="left")
    with torch.no_grad():
        plain = model(**batch)
        with perturbed(model, Uniform(), "layer:1", keep=True, tokenizer=tok) as cap:
            out = model(**batch)
    assert (out - plain).abs().max() > 1e-3
    assert cap.edits["layer"].tolist() == [1] and cap.edits["max_abs_change"].item() > 0
    for amap in cap.maps:  # padding stripped; causal: row i is 1/(i+1) on keys 0..i
        n = amap.pattern.shape[-1]
        expected = torch.ones(n, n).tril() / torch.arange(1, n + 1)[:, None]
        assert torch.allclose(amap.pattern[0], expected.expand_as(amap.pattern[0]))
    assert count_hooks(model) == 0


def test_permuting_uniform_rows_is_not_applied_but_peaked_rows_change():
    model, tok = build_reference("encoder")
    track(model)
    batch = tok(TEXTS)
    with torch.no_grad():
        plain = model(**batch)
        with perturbed(model, Permute(), "layer:0"):
            peaked = model(**batch)
        assert (peaked - plain).abs().max() > 1e-4
        for block in model.blocks:  # q = 0: every score is 0, every row exactly uniform
            block.attn.q_proj.weight.zero_()
            if block.attn.q_proj.bias is not None:
                block.attn.q_proj.bias.zero_()
        with pytest.raises(EditNotAppliedError, match="unchanged"), \
                perturbed(model, Permute(), "layer:0"):
            model(**batch)
    assert count_hooks(model) == 0


def test_mean_on_a_reference_model_is_an_error_before_any_forward(ref):
    model, tok = ref
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(InputError, match="exposes only attention patterns"), \
                perturbed(model, Mean({0: torch.zeros(4, 8)}), "layer:0"):
            model(**tok(TEXTS))
    finally:
        handle.remove()
    assert not calls


def test_scope_and_name_errors(ref):
    model, _ = ref
    for scope, message in [("layer:2", r"layers \[2\] out of range.*\(0\.\.1\)"),
                           ("head:0.4", r"heads \[4\] out of range.*\(0\.\.3\)")]:
        with pytest.raises(InputError, match=message), perturbed(model, "zero", scope):
            pass
    with pytest.raises(InputError, match=r"unknown intervention 'ablate'.*'zero'"), \
            perturbed(model, "ablate"):
        pass
    with pytest.raises(InputError, match="not a registered intervention"), \
            perturbed(model, lambda p, h, g: p):
        pass
    bert = tiny_bert()
    with pytest.raises(InputError, match=r"layers \[2\] out of range.*2 layers"), \
            perturbed(bert, "uniform", Scope(layers=(2,))):
        pass
    with pytest.raises(InputError, match=r"heads \[2\] out of range.*2 heads"), \
            perturbed(bert, "uniform", "head:0.2"):
        pass


def test_an_intervention_that_cannot_run_is_an_error(ref):
    model, _ = ref
    with pytest.raises(HookNotFiredError, match="never called"), perturbed(model, "uniform"):
        pass  # no forward: nothing was perturbed
    plain = track(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    with pytest.raises(AttentionUnavailableError, match="hook_pattern"), \
            perturbed(plain, "zero"):
        plain(torch.ones(1, 4))
    assert count_hooks(model) == 0 and count_hooks(plain) == 0


def test_state_is_restored_when_the_forward_raises(tokenizer):
    model = tiny_bert()
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with pytest.raises(RuntimeError, match="boom"), perturbed(model, Zero(), "layer:0"):
        model(**batch)
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"
    assert count_hooks(model) == 0


# ----------------------------------------------------------------------------- transformers
def test_zero_ablation_of_a_layer_equals_zeroing_its_attention_output_by_hand(tokenizer):
    """transformers 5 dropped ``head_mask``; the hand-made reference is a forward hook that
    zeroes the self-attention output (all heads) before the output projection."""
    model = tiny_bert()
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        handle = self_attention_hook(model, 1, torch.zeros_like)
        try:
            expected = model(**batch).last_hidden_state
        finally:
            handle.remove()
        with perturbed(model, Zero(), "layer:1") as cap:
            out = model(**batch).last_hidden_state
        plain = model(**batch).last_hidden_state
    assert torch.allclose(out, expected, atol=1e-6)
    assert (out - plain).abs().max() > 1e-2
    assert cap.edits["layer"].tolist() == [1] and cap.edits["max_abs_change"].item() > 0


def test_only_scoped_heads_change(tokenizer):
    """Zero head 1 of layer 0 in an eager BERT: head 0's slice of the self-attention output is
    unchanged, head 1's is exactly 0."""
    model = tiny_bert("eager")
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    seen = {}

    def record(x):
        seen.setdefault("out", []).append(x.clone())
        return x

    with torch.no_grad():
        handle = self_attention_hook(model, 0, record)
        try:
            model(**batch)
            with perturbed(model, Zero(), "head:0.1"):
                model(**batch)
        finally:
            handle.remove()
    plain, ablated = seen["out"]
    assert torch.allclose(ablated[..., :8], plain[..., :8], atol=1e-7)  # head 0 (d_head = 8)
    assert torch.all(ablated[..., 8:] == 0)
    assert not torch.allclose(plain[..., 8:], torch.zeros(()))


def test_mean_ablation_equals_a_hand_computed_replacement(tokenizer):
    """Means from one example, checked against the per-head outputs read by a plain hook;
    then mean-ablation of head 0 of layer 1 against a hook that writes that mean by hand."""
    model = tiny_bert()
    text = ["the cat sat on the mat"]
    means = head_output_means(model, tokenizer, text)
    assert sorted(means) == [0, 1] and means[1].shape == (2, 8)
    batch = tokenizer([*text, "a dog ran"], padding=True, return_tensors="pt")
    single = tokenizer(text, return_tensors="pt")
    seen = {}
    with torch.no_grad():
        handle = self_attention_hook(model, 1, lambda x: seen.setdefault("x", x))
        try:
            model(**single)
        finally:
            handle.remove()
    by_hand = seen["x"][0].view(-1, 2, 8).mean(0)  # [head, d_head] over the 8 tokens
    assert torch.allclose(means[1], by_hand, atol=1e-6)

    def write_mean(x):
        x = x.clone()
        x[..., :8] = by_hand[0]
        return x

    with torch.no_grad():
        handle = self_attention_hook(model, 1, write_mean)
        try:
            expected = model(**batch).last_hidden_state
        finally:
            handle.remove()
        with perturbed(model, Mean(means), "head:1.0") as cap:
            out = model(**batch).last_hidden_state
    assert torch.allclose(out, expected, atol=1e-6)
    assert cap.edits["layer"].tolist() == [1]
    with pytest.raises(InputError, match=r"no means for layers \[0\]"), \
            perturbed(model, Mean({1: means[1]})):
        pass
    assert count_hooks(model) == 0


@pytest.mark.parametrize("intervention", [Uniform(), Erase(k=1), Dirichlet(1.0), Permute()],
                         ids=repr)
def test_causal_transformers_model_keeps_the_future_masked(intervention):
    model = tiny_gpt2()
    ids = torch.tensor([[3, 5, 7, 9, 11, 2], [4, 6, 8, 10, 0, 0]])
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    with torch.no_grad(), perturbed(model, intervention, "layer:0", keep=True) as cap:
        model(input_ids=ids, attention_mask=mask)
    for amap in cap.maps:
        p = amap.pattern[0]  # [head, q, k], padding stripped
        assert torch.all(p.triu(1) == 0)
        sums = p.sum(-1)
        if isinstance(intervention, Erase):  # row 0 had one key: erased to nothing
            assert torch.all(sums[:, 0] == 0)
            sums = sums[:, 1:]
        assert torch.allclose(sums, torch.ones(()), atol=1e-6)
    assert model.config._attn_implementation == "sdpa"


def test_batch_copies_get_different_permutations_that_sequential_forwards_reproduce(tokenizer):
    model = tiny_bert()
    single = tokenizer(["the cat sat on the mat"], return_tensors="pt")
    copies = {k: v.expand(6, -1) for k, v in single.items()}
    with torch.no_grad():
        with perturbed(model, Permute(), "layer:0", seed=3):
            batched = model(**copies).last_hidden_state
        with perturbed(model, Permute(), "layer:0", seed=3):
            sequential = torch.cat([model(**single).last_hidden_state for _ in range(6)])
        with perturbed(model, Permute(), "layer:0", seed=3):
            again = model(**copies).last_hidden_state
        with perturbed(model, Permute(), "layer:0", seed=4):
            other = model(**copies).last_hidden_state
    assert torch.allclose(batched, sequential, atol=1e-5)
    assert torch.equal(batched, again) and not torch.equal(batched, other)
    firsts = batched[:, 0]
    assert all(not torch.allclose(firsts[i], firsts[j]) for i in range(6) for j in range(i))


def test_one_generator_can_span_several_contexts(tokenizer):
    model = tiny_bert()
    single = tokenizer(["the cat sat"], return_tensors="pt")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        with perturbed(model, Permute(), "layer:1", generator=gen):
            first = model(**single).last_hidden_state
        with perturbed(model, Permute(), "layer:1", generator=gen):
            second = model(**single).last_hidden_state
        with perturbed(model, Permute(), "layer:1", seed=0):
            both = torch.cat([model(**single).last_hidden_state for _ in range(2)])
    assert torch.equal(torch.cat([first, second]), both)
