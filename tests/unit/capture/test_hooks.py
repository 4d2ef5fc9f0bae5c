"""Capture through module paths: reference hook points and any TransformerLens-style model."""

import pytest
import torch
from torch import nn

import attnprobe as ap
from attnprobe.capture import HookPoint, count_hooks
from attnprobe.capture.parts import Part
from attnprobe.models import build_reference
from tests.conftest import track


@pytest.fixture
def ref():
    model, tok = build_reference("transformer")
    return track(model), tok


def manual_patterns(model, batch):
    """Independent read of every hook_pattern through plain forward hooks."""
    seen = {}
    handles = [mod.register_forward_hook(lambda m, a, out, name=name: seen.__setitem__(name, out))
               for name, mod in model.named_modules() if name.endswith("hook_pattern")]
    try:
        logits = model(**batch)
    finally:
        for h in handles:
            h.remove()
    return logits, seen


def test_reference_capture_equals_manual_hooks_and_strips_padding(ref):
    model, tok = ref
    batch = tok(["the cat sat on the mat", "a dog"], padding_side="left")
    logits, seen = manual_patterns(model, batch)
    with ap.capture(model, tokenizer=tok) as cap:
        out = model(**batch)
    assert torch.equal(out, logits)
    assert len(cap.maps) == 2
    short = cap.maps[1]
    n = int(batch["attention_mask"][1].sum())
    assert short.shape == (2, 4, n, n)
    assert short.query_tokens[0] == "[BOS]" and short.query_tokens[-1] == "dog"
    expected = seen["blocks.1.attn.hook_pattern"][1, :, -n:, -n:]
    assert torch.equal(short.pattern[1], expected)
    assert short.info.causal and short.info.n_layers == 2


def test_layers_and_heads_are_selected(ref):
    model, tok = ref
    batch = tok(["the cat sat"])
    with ap.capture(model, layers=[1], heads=[3]) as cap:
        model(**batch)
    _, seen = manual_patterns(model, batch)
    amap = cap.maps[0]
    assert amap.layers == (1,) and amap.heads == (3,)
    assert torch.equal(amap.pattern[0, 0], seen["blocks.1.attn.hook_pattern"][0, 3])


def test_out_of_range_indices_fail_before_running(ref):
    model, tok = ref
    with pytest.raises(ap.InputError, match="out of range"), ap.capture(model, layers=[7]):
        raise AssertionError("the context must not be entered")
    with pytest.raises(ap.InputError, match="heads"), ap.capture(model, heads=[4]):
        model(**tok(["the cat"]))
    with pytest.raises(ap.InputError, match="non-negative"), ap.capture(model, layers=[-1]):
        pass


def test_hooks_removed_when_the_forward_raises(ref):
    model, tok = ref

    class Boom(nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    original = model.ln_final
    model.ln_final = Boom()
    try:
        with pytest.raises(RuntimeError, match="boom"), ap.capture(model, edit=lambda i, p: p):
            model(**tok(["the cat"]))
        assert count_hooks(model) == 0
    finally:
        model.ln_final = original


def test_hook_that_never_fired_names_the_path():
    class TwoPaths(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = HookPoint()
            self.unused = HookPoint()

        def forward(self, x):
            return self.used(torch.softmax(x, -1))

    model = track(TwoPaths())
    with pytest.raises(ap.HookNotFiredError, match="unused"), \
            ap.capture(model, paths=["used", "unused"]):
        model(torch.randn(1, 2, 3, 3))
    with pytest.raises(ap.HookNotFiredError, match="never called"), \
            ap.capture(model, paths=["used"]):
        pass


class TinyLens(nn.Module):
    """A TransformerLens-shaped model: blocks.{i}.attn.hook_pattern after the softmax."""

    def __init__(self, n_layers=2, n_heads=2, d=8):
        super().__init__()
        self.embed = nn.Embedding(20, d)
        self.blocks = nn.ModuleList()
        for _ in range(n_layers):
            block = nn.Module()
            block.attn = nn.Module()
            block.attn.hook_pattern = HookPoint()
            block.attn.qk = nn.Linear(d, 2 * d)
            self.blocks.append(block)
        self.n_heads = n_heads

    def forward(self, tokens):
        x = self.embed(tokens)
        b, n, d = x.shape
        for block in self.blocks:
            q, k = block.attn.qk(x).view(b, n, 2, self.n_heads, d // self.n_heads).unbind(2)
            scores = torch.einsum("bqhd,bkhd->bhqk", q, k)
            pattern = block.attn.hook_pattern(torch.softmax(scores, -1))
            v = x.view(b, n, self.n_heads, d // self.n_heads)
            x = x + torch.einsum("bhqk,bkhd->bqhd", pattern, v).reshape(b, n, d)
        return x


def test_generic_paths_capture_and_edit():
    model = track(TinyLens())
    tokens = torch.randint(0, 20, (2, 5))
    paths = [f"blocks.{i}.attn.hook_pattern" for i in range(2)]
    with ap.capture(model, paths=paths) as cap:
        clean = model(tokens)
    assert [m.layers for m in cap.maps] == [(0, 1), (0, 1)]

    def uniform(layer, pattern):
        return torch.full_like(pattern, 1 / pattern.shape[-1]) if layer == 1 else pattern

    with ap.capture(model, paths=paths, edit=uniform) as cap:
        edited = model(tokens)
    assert not torch.allclose(clean, edited)
    assert torch.allclose(cap.maps[0].pattern[1], torch.full((2, 5, 5), 0.2))
    assert cap.edits.set_index("layer").loc[1, "max_abs_change"] > 0
    with pytest.raises(ap.EditNotAppliedError), ap.capture(model, paths=paths, edit=lambda i, p: p):
        model(tokens)


def test_edit_must_keep_the_shape():
    model = track(TinyLens())
    with pytest.raises(ap.InputError, match="shape"), \
            ap.capture(model, paths=["blocks.0.attn.hook_pattern"], edit=lambda i, p: p[:, :1]):
        model(torch.randint(0, 20, (1, 4)))


def test_model_without_attention_is_refused():
    model = track(nn.Linear(3, 3))
    with pytest.raises(ap.AttentionUnavailableError, match="paths"), ap.capture(model):
        pass
    with pytest.raises(ap.InputError, match="no module"), ap.capture(model, paths=["nope"]):
        pass


def test_streaming_reducers_match_kept_maps(ref):
    model, tok = ref
    batch = tok(["the cat sat on the mat", "a dog ran"], padding_side="left")
    with ap.capture(model) as kept:
        model(**batch)
    with ap.capture(model, keep=False, reducers=ap.heads.default_reducers()) as streamed:
        model(**batch)
    assert streamed.maps == []
    a = ap.heads.summarize(kept.maps)
    b = streamed.tally.summary()
    assert a.columns.tolist() == b.columns.tolist()
    numeric = a.select_dtypes("number").columns
    assert (a[numeric] - b[numeric]).abs().max().max() < 1e-6


def test_scores_come_with_patterns_on_reference_models(ref):
    model, tok = ref
    batch = tok(["the cat sat on the mat", "a dog"])
    with ap.capture(model, scores=True, layers=[0], heads=[1]) as cap:
        model(**batch)
    short = cap.maps[1]
    assert short.scores is not None and short.scores.shape == short.pattern.shape
    # causal softmax of the kept scores gives back the kept pattern
    n = short.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    recomputed = torch.softmax(short.scores[0, 0].masked_fill(~causal, float("-inf")), -1)
    assert torch.allclose(recomputed, short.pattern[0, 0], atol=1e-6)
    with pytest.raises(ap.InputError, match="hook_scores"), \
            ap.capture(TinyLens(), paths=["blocks.0.attn.hook_pattern"], scores=True):
        pass


def test_nan_in_a_real_row_is_an_error_not_a_statistic():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.hook_pattern = HookPoint()

        def forward(self, x):
            pattern = torch.full((1, 1, 3, 3), 1 / 3)
            pattern[0, 0, 1, 1] = float("nan")
            return self.hook_pattern(pattern) + x

    model = track(Broken())
    with pytest.raises(ap.InputError, match="NaN"), \
            ap.capture(model, keep=False, reducers=ap.heads.default_reducers()):
        model(torch.zeros(()))
    with ap.capture(model) as cap:
        model(torch.zeros(()))
    with pytest.raises(ap.InputError, match="NaN"):
        cap.maps  # noqa: B018 - assembling validates
    with pytest.raises(ap.InputError, match="NaN"):
        cap.maps  # noqa: B018 - and keeps failing the same way


class StepDecoder(nn.Module):
    """Attends over a fixed source once per decoding step, like an RNN decoder with attention."""

    def __init__(self):
        super().__init__()
        self.decoder = nn.Module()
        self.decoder.cross_attn = nn.Module()
        self.decoder.cross_attn.hook_pattern = HookPoint()

    def forward(self, source, steps):
        outputs = []
        for t in range(steps):
            query = source[:, t % source.shape[1]]  # [batch, d]
            scores = torch.einsum("bd,bkd->bk", query, source)[:, None, None, :]
            pattern = self.decoder.cross_attn.hook_pattern(torch.softmax(scores, -1))
            outputs.append(torch.einsum("bhqk,bkd->bqd", pattern, source))
        return torch.cat(outputs, 1)


def test_step_by_step_decoders_stack_their_rows():
    model = track(StepDecoder())
    source = torch.randn(2, 5, 4)
    with ap.capture(model) as cap:
        model(source, steps=3)
    amap = cap.maps[0]
    assert amap.kind == "cross" and amap.shape == (1, 1, 3, 5)
    expected = torch.softmax(source[0, :3] @ source[0].T, -1)
    assert torch.allclose(amap.pattern[0, 0], expected, atol=1e-6)


def test_a_site_running_twice_with_many_rows_is_refused():
    model = track(TinyLens(n_layers=1))
    shared = model.blocks[0]
    model.blocks.append(shared)  # the same layer used at two depths
    with pytest.raises(ap.InputError, match="more than once"), \
            ap.capture(model, paths=["blocks.0.attn.hook_pattern"]):
        model(torch.randint(0, 20, (1, 4)))


def test_stop_early_waits_for_every_path_whatever_order_they_are_given_in():
    model = track(TinyLens(n_layers=3))
    tokens = torch.randint(0, 20, (2, 5))
    paths = [f"blocks.{i}.attn.hook_pattern" for i in (2, 0, 1)]  # not the order they run in
    with ap.capture(model, paths=paths) as full:
        model(tokens)
    ran = []
    with ap.capture(model, paths=paths, stop_early=True) as early:
        model(tokens)
        ran.append(True)  # skipped: the forward stopped after the last of the three
    assert ran == []
    assert [m.layers for m in early.maps] == [(0, 1, 2)] * 2
    for a, b in zip(full.maps, early.maps, strict=True):
        assert torch.equal(a.pattern, b.pattern)


def _visible_counts(model, batch):
    """``rows.visible`` the hook seam hands each part, per layer."""

    class Spy(Part):
        name = "spy"
        whole_rows = False

        def __init__(self):
            self.seen = {}

        def on_rows(self, host, rows):
            self.seen[rows.site.layer] = rows.visible

    spy = Spy()
    with ap.capture(model, parts=[spy]):
        model(**batch)
    return spy.seen


def test_a_causal_reference_model_tells_each_row_how_many_keys_it_sees():
    """Row i of a causal model sees its i + 1 first real tokens (left padding counts none),
    whatever the weights: a one-hot head could not tell."""
    model, tok = build_reference("transformer")  # causal decoder-only
    batch = tok(["the cat sat on the mat", "a dog"], padding_side="left")
    valid = batch["attention_mask"].bool()
    expected = (valid.long().cumsum(-1) - 1).clamp(min=0) + 1
    for visible in _visible_counts(track(model), batch).values():
        assert torch.equal(visible[valid], expected[valid])
    encoder, enc_tok = build_reference("encoder")  # bidirectional: read from the weights
    assert all(v is None for v in _visible_counts(track(encoder), enc_tok(["a dog"])).values())
