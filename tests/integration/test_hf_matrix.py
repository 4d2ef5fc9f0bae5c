"""Capture through the HF seam, family by family, against transformers' own eager path.

Every model is a tiny random model built from a config (``hf_models``) and set to SDPA; its
eager twin has identical weights. Expected attention weights always come from the twin's
``output_attentions=True`` (transformers' eager path), never from attnprobe.
"""

from __future__ import annotations

import copy
from collections import defaultdict

import pytest
import torch

import attnprobe
from attnprobe import AttentionMap, EditNotAppliedError, InputError, count_hooks
from attnprobe.heads import default_reducers, summarize
from attnprobe.loading import TESTED_FAMILIES
from tests.integration.hf_models import (
    FAMILIES,
    FIRST_REAL_ID,
    HEAD_DIM,
    N_HEADS,
    N_LAYERS,
    SLIDING_WINDOW,
    VOCAB,
    build,
    build_pair,
    implementations,
)

TOL = 1e-5
LENGTHS = (9, 5, 7)        # main (encoder / only) side: three examples of different lengths
DEC_LENGTHS = (6, 8, 3)    # decoder side of encoder-decoder models
SIDES = ("left", "right")
NAMES = tuple(FAMILIES)
ROLE_OUTPUT = {"self": "attentions", "encoder": "encoder_attentions",
               "decoder": "decoder_attentions", "cross": "cross_attentions"}


pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_tested_family_has_a_builder():
    assert set(NAMES) == set(TESTED_FAMILIES)


# ---------------------------------------------------------------------------- inputs
def _sequences(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(FIRST_REAL_ID, VOCAB, (n,), generator=g) for n in lengths]


def _pad(seqs, pad_id, side):
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        span = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[i, span] = s
        mask[i, span] = 1
    return ids, mask


def _positions(mask):
    return (mask.cumsum(-1) - 1).clamp(min=0)


def make_inputs(name, side, *, position_ids=False, lengths=LENGTHS, dec_lengths=DEC_LENGTHS):
    """Padded batch (same token sequences whatever the side) as model keyword arguments."""
    family = FAMILIES[name]
    ids, mask = _pad(_sequences(lengths, 1), family.pad_id, side)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if family.encdec:
        dec_ids, dec_mask = _pad(_sequences(dec_lengths, 2), family.pad_id, side)
        inputs.update(decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask)
    if position_ids:
        assert family.position_ids
        inputs["position_ids"] = _positions(mask)
    return inputs


def _masks(inputs, role):
    """(query mask, key mask) ``[batch, seq]`` bool of an attention role."""
    main = inputs["attention_mask"].bool()
    dec = inputs.get("decoder_attention_mask")
    dec = None if dec is None else dec.bool()
    return {"self": (main, main), "encoder": (main, main), "decoder": (dec, dec),
            "cross": (dec, main)}[role]


def _role(amap: AttentionMap, encdec: bool) -> str:
    if not encdec:
        return "self"
    if amap.kind == "cross":
        return "cross"
    return "decoder" if "decoder" in amap.stack else "encoder"


def roles(name):
    return ("encoder", "decoder", "cross") if FAMILIES[name].encdec else ("self",)


def by_role(maps, name):
    """Maps grouped by attention role, each list in example order."""
    grouped = defaultdict(list)
    for amap in maps:
        grouped[_role(amap, FAMILIES[name].encdec)].append(amap)
    assert set(grouped) == set(roles(name)), sorted(grouped)
    for role, group in grouped.items():
        assert len(group) == len(LENGTHS), (role, len(group))
        assert len({m.stack for m in group}) == 1
    return dict(grouped)


def eager_weights(twin, inputs, masks_from=None):
    """Per role, per example: the eager twin's weights ``[layer, head, q, k]``, real tokens only
    (real tokens as given by the masks of ``masks_from``, by default ``inputs``)."""
    with torch.no_grad():
        out = twin(**inputs, output_attentions=True)
    expected = {}
    for role in roles_of_output(out):
        layers = getattr(out, ROLE_OUTPUT[role])
        assert len(layers) == N_LAYERS
        q_mask, k_mask = _masks(masks_from or inputs, role)
        expected[role] = [torch.stack([a[b] for a in layers])[:, :, q_mask[b]][..., k_mask[b]]
                          for b in range(q_mask.shape[0])]
    return expected


def roles_of_output(out):
    return ("encoder", "decoder", "cross") if hasattr(out, "encoder_attentions") else ("self",)


def captured(model, inputs, **kwargs):
    with torch.no_grad(), attnprobe.capture(model, **kwargs) as cap:
        out = model(**inputs)
    return cap, out


def max_diff_real(a, b, mask):
    return (a - b)[mask.bool()].abs().max().item()


def assert_outputs_close(name, out, ref, inputs, tol=TOL):
    if FAMILIES[name].encdec:
        assert max_diff_real(out.last_hidden_state, ref.last_hidden_state,
                             inputs["decoder_attention_mask"]) <= tol
        assert max_diff_real(out.encoder_last_hidden_state, ref.encoder_last_hidden_state,
                             inputs["attention_mask"]) <= tol
    else:
        assert max_diff_real(out.last_hidden_state, ref.last_hidden_state,
                             inputs["attention_mask"]) <= tol


def assert_maps_match(maps_by_role, expected, tol=TOL):
    for role, group in maps_by_role.items():
        for b, amap in enumerate(group):
            want = expected[role][b]
            assert amap.shape == tuple(want.shape), (role, b, amap.shape, tuple(want.shape))
            diff = (amap.pattern - want).abs().max().item()
            assert diff <= tol, f"{role} example {b}: max abs diff {diff:.3g}"


# -------------------------------------------------------------------- core equalities
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", NAMES)
def test_captured_sdpa_outputs_equal_uncaptured(name, side):
    model = build(name)
    inputs = make_inputs(name, side)
    with torch.no_grad():
        ref = model(**inputs)
    cap, out = captured(model, inputs)
    assert cap.maps
    assert_outputs_close(name, out, ref, inputs)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", NAMES)
def test_captured_weights_equal_eager_twin(name, side):
    model, twin = build_pair(name)
    inputs = make_inputs(name, side)
    cap, _ = captured(model, inputs)
    maps = by_role(cap.maps, name)
    expected = eager_weights(twin, inputs)
    assert set(expected) == set(maps)
    assert_maps_match(maps, expected)
    for role, group in maps.items():
        q_mask, k_mask = _masks(inputs, role)
        q_ids = inputs["decoder_input_ids" if role in ("decoder", "cross") else "input_ids"]
        for b, amap in enumerate(group):
            assert amap.layers == tuple(range(N_LAYERS))
            assert amap.heads == tuple(range(N_HEADS))
            assert amap.kind == ("cross" if role == "cross" else "self")
            assert len(amap.query_tokens) == int(q_mask[b].sum())
            assert len(amap.key_tokens) == int(k_mask[b].sum())
            assert amap.query_tokens == tuple(str(int(i)) for i in q_ids[b][q_mask[b]])
            k_ids = inputs["input_ids" if role != "decoder" else "decoder_input_ids"]
            assert amap.key_tokens == tuple(str(int(i)) for i in k_ids[b][k_mask[b]])
            assert torch.allclose(amap.pattern.sum(-1), torch.ones(()), atol=1e-5)
    # the random models are not trivially uniform, so these comparisons mean something
    spread = max(m.pattern.max().item() for m in cap.maps)
    assert spread > 0.5


@pytest.mark.parametrize("name", NAMES)
def test_capture_of_an_eager_model(name):
    """A model already set to eager: the seam delegates to eager (additive float masks)."""
    _, twin = build_pair(name)
    inputs = make_inputs(name, "left")
    expected = eager_weights(twin, inputs)
    with torch.no_grad():
        ref = twin(**inputs)
    cap, out = captured(twin, inputs)
    assert implementations(twin) == {"eager"}
    assert_outputs_close(name, out, ref, inputs)
    assert_maps_match(by_role(cap.maps, name), expected)


@pytest.mark.parametrize("name", ("bert", "llama", "t5"))
def test_two_forward_calls_in_one_context(name):
    model, twin = build_pair(name)
    first, second = make_inputs(name, "right"), make_inputs(name, "left")
    with torch.no_grad(), attnprobe.capture(model) as cap:
        model(**first)
        model(**second)
    n = len(LENGTHS)
    assert [m.example_id for m in cap.maps][::len(roles(name))] == [str(i) for i in range(2 * n)]
    k = n * len(roles(name))
    assert_maps_match(by_role(cap.maps[:k], name), eager_weights(twin, first))
    assert_maps_match(by_role(cap.maps[k:], name), eager_weights(twin, second))


@pytest.mark.parametrize("name", NAMES)
def test_unpadded_batch_without_attention_mask(name):
    """No attention_mask at all (SDPA may then run mask-free, with ``is_causal``)."""
    model, twin = build_pair(name)
    full = make_inputs(name, "right", lengths=(9, 9, 9), dec_lengths=(6, 6, 6))
    inputs = {k: v for k, v in full.items() if "attention_mask" not in k}
    with torch.no_grad():
        ref = model(**inputs)
    cap, out = captured(model, inputs)
    assert_outputs_close(name, out, ref, full)
    assert_maps_match(by_role(cap.maps, name), eager_weights(twin, inputs, masks_from=full))


def test_mistral_sliding_window_matters():
    model, _ = build_pair("mistral")
    inputs = make_inputs("mistral", "right")
    cap, _ = captured(model, inputs)
    longest = cap.maps[0].pattern  # 9 tokens > SLIDING_WINDOW
    n = longest.shape[-1]
    q, k = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    assert n > SLIDING_WINDOW
    assert longest[..., (q - k) >= SLIDING_WINDOW].abs().max().item() == 0.0
    assert longest[..., (q - k) == SLIDING_WINDOW - 1].min().item() > 0.0


# --------------------------------------------------------------------- padding sides
ROPE = ("llama", "mistral", "qwen2")


@pytest.mark.parametrize("name", NAMES)
def test_left_and_right_padding_give_same_maps(name):
    family = FAMILIES[name]
    if name == "bart":
        pytest.skip("BART's learned absolute positions count left padding (the encoder uses "
                    "arange(seq_len) and BartModel.forward takes no position_ids), so left "
                    "padding genuinely shifts every real token's position")
    # Absolute-position models (BERT, GPT-2) get position ids from the mask; RoBERTa derives
    # them from the padding itself, T5 uses relative position buckets.
    use_positions = family.position_ids
    model = build(name)
    maps = {}
    for side in SIDES:
        cap, _ = captured(model, make_inputs(name, side, position_ids=use_positions))
        maps[side] = by_role(cap.maps, name)
    for role in roles(name):
        for left, right in zip(maps["left"][role], maps["right"][role], strict=True):
            assert left.query_tokens == right.query_tokens
            assert left.key_tokens == right.key_tokens
            assert (left.pattern - right.pattern).abs().max().item() <= TOL


@pytest.mark.parametrize("name", ROPE)
def test_rope_left_right_equal_even_without_position_ids(name):
    """RoPE scores depend only on position differences, so a shift by the padding is harmless."""
    model = build(name)
    maps = {side: captured(model, make_inputs(name, side))[0].maps for side in SIDES}
    for left, right in zip(maps["left"], maps["right"], strict=True):
        assert (left.pattern - right.pattern).abs().max().item() <= TOL


@pytest.mark.parametrize("name", ("bert", "gpt2"))
def test_absolute_positions_make_left_padding_differ_without_position_ids(name):
    """Sanity check of the test above: without position ids the maps do differ."""
    model = build(name)
    maps = {side: captured(model, make_inputs(name, side))[0].maps for side in SIDES}
    shorter = [(left, right) for left, right in zip(maps["left"], maps["right"], strict=True)
               if len(left.query_tokens) < max(LENGTHS)]
    assert max((a.pattern - b.pattern).abs().max().item() for a, b in shorter) > 1e-3


# ------------------------------------------------------------------- implementation
@pytest.mark.parametrize("name", NAMES)
def test_attention_implementation_restored(name):
    model = build(name)
    inputs = make_inputs(name, "right")
    with torch.no_grad():
        ref = model(**inputs)
    with torch.no_grad(), attnprobe.capture(model):
        assert model.config._attn_implementation != "sdpa"  # the seam is in place
        model(**inputs)
    assert implementations(model) == {"sdpa"}

    with pytest.raises(RuntimeError, match="boom"), torch.no_grad(), attnprobe.capture(model):
        model(**inputs)
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"
    assert implementations(model) == {"sdpa"}
    with torch.no_grad():
        after = model(**inputs)
    assert_outputs_close(name, after, ref, inputs, tol=0.0)


# ------------------------------------------------------------------------ selection
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", NAMES)
def test_layer_and_head_selection(name, side):
    model, twin = build_pair(name)
    inputs = make_inputs(name, side)
    with torch.no_grad():
        ref = model(**inputs)
    cap, out = captured(model, inputs, layers=[1], heads=[2])
    assert_outputs_close(name, out, ref, inputs)
    assert {s.layer for s in cap.sites} == {1}
    maps = by_role(cap.maps, name)
    expected = eager_weights(twin, inputs)
    for role, group in maps.items():
        for b, amap in enumerate(group):
            assert amap.layers == (1,)
            assert amap.heads == (2,)
            assert amap.shape[:2] == (1, 1)
            want = expected[role][b][1:2, 2:3]
            assert amap.shape == tuple(want.shape)
            assert (amap.pattern - want).abs().max().item() <= TOL
            assert (amap.head(1, 2) - want[0, 0]).abs().max().item() <= TOL


@pytest.mark.parametrize("layers", [[5], [2], [-1], []])
@pytest.mark.parametrize("name", NAMES)
def test_out_of_range_layer_raises_before_running(name, layers):
    model = build(name)
    ran = []
    with pytest.raises(InputError, match="layers"), attnprobe.capture(model, layers=layers):
        ran.append(True)
    assert not ran
    assert implementations(model) == {"sdpa"}


@pytest.mark.parametrize("name", NAMES)
def test_out_of_range_head_raises(name):
    model = build(name)
    inputs = make_inputs(name, "right")
    with pytest.raises(InputError, match="heads"), torch.no_grad(), \
            attnprobe.capture(model, heads=[9]):
        model(**inputs)
    assert implementations(model) == {"sdpa"}


# --------------------------------------------------------------------------- edits
def _ablate_layer0_head0(layer, pattern):
    if layer != 0:
        return pattern
    pattern = pattern.clone()
    pattern[:, 0] = 0.0
    return pattern


def _zero_head0_inputs(module, args):
    x = args[0].clone()
    x[..., :HEAD_DIM] = 0.0
    return (x, *args[1:])


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", NAMES)
def test_head_ablation_edit(name, side):
    """Zeroing head 0 of layer 0 equals zeroing that head's slice before the output projection
    of the eager twin (transformers' own computation, ablated by a pre-hook)."""
    model, twin = build_pair(name)
    inputs = make_inputs(name, side)
    with torch.no_grad():
        ref = model(**inputs)
    cap, out = captured(model, inputs, edit=_ablate_layer0_head0)

    eager_weights(twin, inputs)  # let transformers install its own output-capturing hooks
    before = count_hooks(twin)
    handles = [twin.get_submodule(path).register_forward_pre_hook(_zero_head0_inputs)
               for path in FAMILIES[name].out_proj]
    try:
        with torch.no_grad():
            ablated = twin(**inputs)
        expected = eager_weights(twin, inputs)
    finally:
        for handle in handles:
            handle.remove()
    assert count_hooks(twin) == before
    for role in expected:  # the eager twin reports the weights before the (hooked) ablation
        for want in expected[role]:
            want[0, 0] = 0.0

    # the edit changed the outputs, exactly as the eager ablation does
    assert_outputs_close(name, out, ablated, inputs)
    key = "decoder_attention_mask" if FAMILIES[name].encdec else "attention_mask"
    assert max_diff_real(out.last_hidden_state, ref.last_hidden_state, inputs[key]) > 1e-3
    # the captured pattern shows the edit (and layer 1 sees its consequences)
    maps = by_role(cap.maps, name)
    for group in maps.values():
        for amap in group:
            assert amap.head(0, 0).abs().max().item() == 0.0
            assert amap.head(0, 1).sum(-1).sub(1).abs().max().item() <= 1e-5
    assert_maps_match(maps, expected)
    edited = cap.edits
    assert set(edited["layer"]) == {0, 1}
    assert (edited.loc[edited["layer"] == 0, "max_abs_change"] > 0).all()
    assert (edited.loc[edited["layer"] == 1, "max_abs_change"] == 0).all()
    assert len(edited) == N_LAYERS * len(roles(name))


@pytest.mark.parametrize("name", NAMES)
def test_identity_edit_raises(name):
    model = build(name)
    inputs = make_inputs(name, "right")
    with pytest.raises(EditNotAppliedError), torch.no_grad(), \
            attnprobe.capture(model, edit=lambda layer, p: p):
        model(**inputs)
    assert implementations(model) == {"sdpa"}


# ----------------------------------------------------------------- streaming reducers
def _summary_sorted(frame):
    keys = ["stack", "kind", "layer", "head"]
    return frame.sort_values(keys).reset_index(drop=True)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", NAMES)
def test_streaming_reducers_equal_kept_maps(name, side):
    model = build(name)
    inputs = make_inputs(name, side)
    cap_kept, _ = captured(model, inputs)
    cap_stream, _ = captured(model, inputs, keep=False, reducers=default_reducers(),
                             query_block=2)
    assert cap_stream.maps == []
    streamed = _summary_sorted(cap_stream.tally.summary())
    kept = _summary_sorted(summarize(cap_kept.maps))
    assert list(streamed.columns) == list(kept.columns)
    assert len(streamed) == N_LAYERS * N_HEADS * len(roles(name))
    assert streamed[["stack", "kind", "layer", "head"]].equals(kept[["stack", "kind", "layer",
                                                                     "head"]])
    stats = [c for c in kept.columns if c not in ("stack", "kind", "layer", "head", "head_id")]
    assert {"entropy", "max_weight", "prev", "self", "next", "key[0]"} <= set(stats)
    diff = (streamed[stats] - kept[stats]).abs().max().max()
    assert diff <= 1e-6, f"streamed vs kept summary differ by {diff:.3g}"


@pytest.mark.parametrize("name", ("bert", "gpt2", "mistral", "t5"))
def test_streaming_reducers_without_attention_mask(name):
    """Mask-free SDPA (``is_causal``): the blocked rows must rebuild the causal mask."""
    model = build(name)
    full = make_inputs(name, "right", lengths=(9, 9, 9), dec_lengths=(6, 6, 6))
    inputs = {k: v for k, v in full.items() if "attention_mask" not in k}
    cap_kept, _ = captured(model, inputs)
    cap_stream, _ = captured(model, inputs, keep=False, reducers=default_reducers(),
                             query_block=2)
    streamed = _summary_sorted(cap_stream.tally.summary())
    kept = _summary_sorted(summarize(cap_kept.maps))
    stats = [c for c in kept.columns if c not in ("stack", "kind", "layer", "head", "head_id")]
    assert (streamed[stats] - kept[stats]).abs().max().max() <= 1e-6


# ------------------------------------------------------------ precision and scopes
@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_weights_equal_eager_twin(name):
    """bfloat16 rows are off 1 by a few 1e-3: checked to bfloat16's precision, not float32's."""
    model, twin = build_pair(name)
    model.to(torch.bfloat16)
    twin.to(torch.bfloat16)
    inputs = make_inputs(name, "right")
    cap, _ = captured(model, inputs)
    maps = by_role(cap.maps, name)
    expected = {role: [w.float() for w in group]
                for role, group in eager_weights(twin, inputs).items()}
    assert_maps_match(maps, expected, tol=0.0)
    assert {m.info.dtype for m in cap.maps} == {"bfloat16"}


@pytest.mark.parametrize("name", NAMES)
def test_scope_that_is_no_grid_in_every_stack(name):
    """``heads:0.1,1.0``: every stack's maps hold the grid layers (0, 1) × heads (0, 1), the
    streamed tally exactly the two heads."""
    model, twin = build_pair(name)
    inputs = make_inputs(name, "right")
    cap, _ = captured(model, inputs, scope="heads:0.1,1.0")
    maps = by_role(cap.maps, name)
    expected = {role: [w[:, :2] for w in group]
                for role, group in eager_weights(twin, inputs).items()}
    assert_maps_match(maps, expected)
    assert {(m.layers, m.heads) for m in cap.maps} == {((0, 1), (0, 1))}
    streamed, _ = captured(model, inputs, scope="heads:0.1,1.0", keep=False,
                           reducers=default_reducers(), query_block=2)
    summary = streamed.tally.summary()
    assert len(summary) == 2 * len(roles(name))
    assert set(zip(summary["layer"], summary["head"], strict=True)) == {(0, 1), (1, 0)}


# ------------------------------------------------------------ generation (KV cache)
CAUSAL = tuple(name for name in NAMES if FAMILIES[name].causal)


def _lm_pair(name):
    """A tiny language model of family ``name`` (SDPA, tracked) and its eager twin."""
    from tests.integration.causal_lms import causal_lm

    model, _ = causal_lm(name)
    twin = type(model)(copy.deepcopy(model.config)).eval()
    twin.load_state_dict(model.state_dict())
    twin.set_attn_implementation("eager")
    return model, twin


def _generated(model, inputs, sample, **kwargs):
    torch.manual_seed(7)
    with torch.no_grad(), attnprobe.capture(model, **kwargs) as cap:
        out = model.generate(**inputs, max_new_tokens=5, min_new_tokens=5, do_sample=sample,
                             pad_token_id=0)
    return cap, out


@pytest.mark.parametrize("sample", [False, True])
@pytest.mark.parametrize("name", CAUSAL)
def test_capture_around_generate_equals_one_forward(name, sample):
    """Left-padded batch, KV cache on: one map per sequence over the tokens fed (prompt + 4 of
    the 5 new ones), equal to the eager twin's forward over that whole sequence; keys after
    a row's position exactly 0 (Mistral: and before its sliding window)."""
    model, twin = _lm_pair(name)
    inputs = make_inputs(name, "left")
    cap, out = _generated(model, inputs, sample)
    fed = out[:, :-1]  # the last new token is never fed back
    mask = torch.cat([inputs["attention_mask"], torch.ones(len(LENGTHS), 4, dtype=torch.long)],
                     dim=1)
    expected = eager_weights(twin, {"input_ids": fed, "attention_mask": mask,
                                    "position_ids": _positions(mask)})
    maps = by_role(cap.maps, name)
    assert_maps_match(maps, expected)
    for n, amap in zip(LENGTHS, maps["self"], strict=True):
        assert amap.prompt_length == n and amap.shape[2] == n + 4
        assert amap.key_tokens[-4:] == tuple(str(int(t)) for t in out[LENGTHS.index(n), -5:-1])
        later = torch.ones(n + 4, n + 4, dtype=torch.bool).triu(1)
        assert amap.pattern[..., later].abs().max() == 0
    if name == "mistral":
        far = torch.ones(13, 13, dtype=torch.bool).tril(-SLIDING_WINDOW)
        assert maps["self"][0].pattern[..., far].abs().max() == 0
    assert count_hooks(model) == 0 and implementations(model) == {"sdpa"}


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("name", CAUSAL)
def test_streaming_reducers_during_generate_equal_the_folded_maps(name, masked):
    """Reducers fed step by step (positions counted over the cache, Mistral's window keys
    placed where they are) sum to the statistics of the folded maps."""
    model, _ = _lm_pair(name)
    inputs = make_inputs(name, "left", lengths=LENGTHS if masked else (9, 9, 9))
    if not masked:
        del inputs["attention_mask"]
    kept, out_kept = _generated(model, inputs, sample=False)
    streamed, out_streamed = _generated(model, inputs, sample=False, keep=False,
                                        reducers=default_reducers())
    assert torch.equal(out_kept, out_streamed)
    a = _summary_sorted(streamed.tally.summary())
    b = _summary_sorted(summarize(kept.maps))
    stats = [c for c in b.columns if c not in ("stack", "kind", "layer", "head", "head_id")]
    assert (a[stats] - b[stats]).abs().max().max() <= 1e-6
