"""Path patching (``ap.patch.path``) against independent constructions:

- a 2-layer attention-only model built so that the clean/corrupt difference enters layer 1
  only through layer 0's heads (layer 0 writes nothing into the subspace where the two
  inputs' embeddings differ, layer 1 reads nothing of it, and the two embeddings there have
  one norm, so RMSNorm scales alike): path patching from every layer-0 head into layer 1's
  q, k and v is then activation patching of layer 1's q, k and v;
- a tiny GPT-2 with MLPs: the receivers' inputs of path patching are those computed from the
  base residual plus the sender's difference ``(z_other − z_base) · W_O^h`` injected before
  layer 1 (no freezing involved);
- ``ref:induction`` in the noising direction: the previous-token heads act through the
  induction heads' keys, not their queries or values (the issue's proof).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import attnprobe as ap
from attnprobe.capture import Activations, EditKey, EditQuery, EditValue
from attnprobe.models.decoder_only import LlamaConfig, LlamaModel
from attnprobe.models.tokenizer import WordTokenizer
from attnprobe.models.zoo import finish_reference
from tests.conftest import track
from tests.integration.causal_lms import causal_lm
from tests.integration.hf_models import FAMILIES
from tests.unit.patch.inputs import batch_of, induction_pairs, metric_values

S = slice(0, 4)  # the residual dimensions where clean and corrupt embeddings differ


def designed_model() -> tuple[LlamaModel, WordTokenizer, list[list[int]], list[list[int]]]:
    tok = WordTokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaModel(LlamaConfig(len(tok), d_model=32, n_layers=2, n_heads=4,
                                       n_kv_heads=4, attention_only=True))
    clean = [[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]]
    corrupt = [[30, 31, 12, 33, 14, 15], [40, 21, 42, 23, 44, 25]]
    with torch.no_grad():
        model.embed.weight[:, S] *= 4  # layer 0 reads a lot from S: a large difference
        for row, other in zip(clean, corrupt, strict=True):
            for a, b in zip(row, other, strict=True):
                if a != b:
                    model.embed.weight[b] = model.embed.weight[a]
                    model.embed.weight[b, S] *= -1
        model.blocks[0].attn.out_proj.weight[S, :] = 0
        for proj in ("q_proj", "k_proj", "v_proj"):
            getattr(model.blocks[1].attn, proj).weight[:, S] = 0
    return track(finish_reference(model, "designed")), tok, clean, corrupt


def layer1_patched(model, base, other):
    """The output of ``base`` with layer 1's q, k and v (every head) from ``other``."""
    with torch.no_grad(), ap.capture(model, "layer:1", parts=[Activations(("q", "k", "v"))]) \
            as cap:
        model(**other)
    (acts,) = cap.activations[0].values()

    def take(name):
        return lambda layer, t: acts[name].clone() if layer == 1 else t

    with torch.no_grad(), ap.capture(model, "layer:1", parts=[
            EditQuery(take("q")), EditKey(take("k")), EditValue(take("v"))]):
        return model(**base)


@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_every_layer0_head_into_layer1_qkv_is_activation_patching_of_layer1(direction):
    model, tok, clean, corrupt = designed_model()
    base, other = batch_of(corrupt), batch_of(clean)
    if direction == "noising":
        base, other = other, base
    spec = "logit:next"
    table = ap.patch.path(model, tok, clean, corrupt, spec, senders="layer:0",
                          receivers="layer:1", into=("q", "k", "v"), per="scope",
                          direction=direction, metric_positions="all")
    want = metric_values(spec, tok, layer1_patched(model, base, other), base, "all",
                         batch_of(clean)).numpy()
    np.testing.assert_allclose(table.sort_values("example_id")["patched"], want, atol=1e-5,
                               rtol=1e-5)
    moved = np.abs(table["patched"].to_numpy() - table[
        "corrupt" if direction == "denoising" else "clean"].to_numpy())
    assert moved.min() > 1e-3  # the construction makes the path matter
    assert list(table.columns[-4:]) == ["sender_layer", "sender_head", "receivers", "into"]
    assert set(table["into"]) == {"q,k,v"} and set(table["receivers"]) == {"layer:1"}


def gpt2(n_layers: int):
    model, tok = causal_lm("gpt2")
    if n_layers == 2:
        return model, tok
    config = FAMILIES["gpt2"].config()
    config.n_layer = n_layers
    torch.manual_seed(0)
    return track(transformers.GPT2LMHeadModel(config).eval()), tok


@pytest.mark.parametrize(("n_layers", "into"), [(2, "q"), (2, "v"), (3, "k")])
def test_receivers_see_the_base_residual_plus_the_senders_difference(n_layers, into):
    """GPT-2 with MLPs: the reference injects ``(z_other − z_base) · W_O^h`` into the residual
    before the receivers' layer and reads their inputs there; path patching freezes every
    other head and MLP instead (with 3 layers, layer 1's heads and both MLPs in between).
    Both must give the same receivers' inputs, hence the same metric."""
    model, tok = gpt2(n_layers)
    clean = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]]
    corrupt = [[25, 26, 27, 8, 9, 10], [31, 32, 13, 34, 15, 16]]
    base, other = batch_of(corrupt), batch_of(clean)
    spec = "logit:next"
    receiver = n_layers - 1
    table = ap.patch.path(model, tok, clean, corrupt, spec, senders="layer:0",
                          receivers=f"layer:{receiver}", into=into, metric_positions="all")
    for head in range(4):
        got = table[table["sender_head"] == head].sort_values("example_id")["patched"]
        want = _injected(model, base, other, head, into, spec, tok, receiver)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=into)


def _z(model, inputs):
    with torch.no_grad(), ap.capture(model, "layer:0", parts=[Activations(("z",))]) as cap:
        model(**inputs)
    (acts,) = cap.activations[0].values()
    return acts["z"]  # [batch, head, position, d_head]


def _injected(model, base, other, head, into, spec, tok, receiver):
    d = 8
    diff = (_z(model, other) - _z(model, base))[:, head]  # [batch, position, d_head]
    W_O = model.transformer.h[0].attn.c_proj.weight  # Conv1D: [head * d_head, d_model]
    delta = diff @ W_O[head * d:(head + 1) * d]  # [batch, position, d_model]

    def inject(module, args, kwargs):
        if args:
            return (args[0] + delta, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + delta}

    block = model.transformer.h[receiver]
    handle = block.register_forward_pre_hook(inject, with_kwargs=True)
    try:
        with torch.no_grad(), ap.capture(model, f"layer:{receiver}",
                                         parts=[Activations((into,))]) as cap:
            model(**base)
    finally:
        handle.remove()
    (acts,) = cap.activations[0].values()
    recorded = acts[into]
    edit = {"q": EditQuery, "k": EditKey, "v": EditValue}[into]
    with torch.no_grad(), ap.capture(model, f"layer:{receiver}", parts=[
            edit(lambda layer, t: recorded.clone())]):
        out = model(**base)
    return metric_values(spec, tok, out, base, "all", other).numpy()  # denoising: other clean


def test_previous_token_heads_act_through_the_induction_heads_keys():
    model, tok = ap.load_model("ref:induction")
    clean, corrupt, positions = induction_pairs(tok, n=4)
    largest = {}
    for into in ("q", "k", "v"):
        table = ap.patch.path(model, tok, clean, corrupt, "logit:next", senders="layer:0",
                              receivers="layer:1", into=into, direction="noising",
                              metric_positions=positions)
        largest[into] = ap.patch.summary(table)["effect"].abs().max()
    assert largest["k"] > 0.3, largest
    assert largest["k"] > 4 * max(largest["q"], largest["v"]), largest


def test_path_refusals_are_one_line():
    model, tok, clean, corrupt = designed_model()
    with pytest.raises(ap.InputError, match="needs receivers"):
        ap.patch.run(model, tok, clean, corrupt, "logit:next", "path")
    with pytest.raises(ap.InputError, match=r"no sender .* before the last receiver"):
        ap.patch.path(model, tok, clean, corrupt, "logit:next", senders="layer:1",
                      receivers="layer:1")
    with pytest.raises(ap.InputError, match="instead of scope"):
        ap.patch.run(model, tok, clean, corrupt, "logit:next", "path", scope="layer:0",
                     receivers="layer:1")
    with pytest.raises(ap.InputError, match="unknown into 'z'"):
        ap.patch.path(model, tok, clean, corrupt, "logit:next", receivers="layer:1",
                      into="z")
    from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert

    vocab = bert_vocab()
    bert = tiny_bert(vocab)
    with pytest.raises(ap.InputError, match=r"path patching .* pre-norm.*post-norm"):
        ap.patch.path(bert, bert_tokenizer(vocab), ["the cat sat"], ["the dog sat"],
                      lambda out, batch: out.last_hidden_state[:, 0, 0],
                      receivers="layer:1")


def test_a_sender_position_where_both_runs_agree_moves_nothing():
    """Causal GPT-2, inputs that differ only in their last token: a sender's output at an
    earlier position is the same in both runs, so patching it changes nothing (exactly the
    base run); at the last position it moves the metric."""
    model, tok = causal_lm("gpt2")
    clean, corrupt = [[5, 6, 7, 8, 9, 10]], [[5, 6, 7, 8, 9, 30]]
    table = ap.patch.path(model, tok, clean, corrupt, "logit:w20", senders="head:0.1",
                          receivers="layer:1", into=("q", "k", "v"), positions="each")
    assert list(table["position"]) == [0, 1, 2, 3, 4, 5]
    early = table[table["position"] < 5]
    np.testing.assert_allclose(early["patched"], early["corrupt"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(early["effect"], 0.0, atol=1e-4)
    last = table[table["position"] == 5]
    assert abs(float(last["patched"].iloc[0] - last["corrupt"].iloc[0])) > 1e-4
