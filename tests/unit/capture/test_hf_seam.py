"""Small checks of the HF seam that the architecture matrix does not cover."""

import pytest
import torch
from transformers import BertConfig, BertModel

import attnprobe as ap
from tests.conftest import track


@pytest.fixture
def bert():
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=20, attn_implementation="sdpa")
    return track(BertModel(config).eval())


def test_fully_masked_example_is_an_error_and_state_is_restored(bert):
    ids = torch.randint(5, 50, (2, 4))
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]])
    with pytest.raises(ap.InputError, match="fully masked"), ap.capture(bert):
        bert(input_ids=ids, attention_mask=mask)
    assert bert.config._attn_implementation == "sdpa"


def test_nested_captures_each_get_their_layers(bert):
    ids = torch.randint(5, 50, (1, 5))
    with ap.capture(bert, layers=[0]) as outer:
        with ap.capture(bert, layers=[1]) as inner:
            bert(input_ids=ids)
        assert bert.config._attn_implementation.startswith("attnprobe_")
    assert bert.config._attn_implementation == "sdpa"
    assert inner.maps[0].layers == (1,)
    assert outer.maps[0].layers == (0,)


def test_no_request_means_no_extra_work(bert):
    ids = torch.randint(5, 50, (1, 5))
    with torch.no_grad(), ap.capture(bert, keep=False) as cap:
        out = bert(input_ids=ids).last_hidden_state
    assert cap.maps == [] and cap.tally.to_frame().empty
    with torch.no_grad():
        assert torch.equal(out, bert(input_ids=ids).last_hidden_state)


def test_tokens_come_from_the_tokenizer_when_given(bert):
    class Vocab:
        def convert_ids_to_tokens(self, ids):
            return [f"w{i}" for i in ids]

    ids = torch.tensor([[7, 8, 9]])
    with ap.capture(bert, tokenizer=Vocab()) as cap:
        bert(input_ids=ids)
    assert cap.maps[0].query_tokens == ("w7", "w8", "w9")


def test_registrations_are_removed_on_exit(bert):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    ids = torch.randint(5, 50, (1, 4))
    with ap.capture(bert):
        assert "attnprobe_sdpa" in AttentionInterface._global_mapping
        assert "attnprobe_sdpa" in AttentionMaskInterface._global_mapping
        bert(input_ids=ids)
    assert "attnprobe_sdpa" not in AttentionInterface._global_mapping
    assert "attnprobe_sdpa" not in AttentionMaskInterface._global_mapping
    with pytest.raises(RuntimeError), ap.capture(bert):
        raise RuntimeError("inside")
    assert "attnprobe_sdpa" not in AttentionInterface._global_mapping


def test_a_real_query_row_with_no_open_key_is_an_error():
    from attnprobe.capture.attend import _additive_rows, _visible_keys
    from attnprobe.capture.sites import Site

    site = Site(path="layers.0.attn", stack="layers", kind="self", layer=0)
    allowed = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    allowed[0, 0, 2] = False  # query 2 may attend to nothing
    allowed[0, 0, 1, 2] = False  # query 1 sees two keys
    additive = _additive_rows(allowed, slice(0, 3), 3, 3, False, torch.float32, "cpu")
    # which rows are real is asked for (a callable) only when some row has no open key
    visible = _visible_keys(additive, lambda: torch.tensor([[True, True, False]]), 3, 3, site)
    assert visible.tolist() == [[3, 2, 0]]  # the padding row 2: fine, nothing visible
    with pytest.raises(ap.InputError, match=r"query 2 of example 0 at layers\.0\.attn"):
        _visible_keys(additive, lambda: torch.tensor([[True, True, True]]), 3, 3, site)
    causal = _additive_rows(None, slice(1, 3), 3, 3, True, torch.float32, "cpu")
    assert causal.shape == (1, 1, 2, 3)
    assert torch.equal(causal[0, 0] == 0, torch.tensor([[True, True, False], [True, True, True]]))


def test_training_mode_captures_weights_before_dropout():
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=20, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.5, attn_implementation="sdpa")
    model = track(BertModel(config))
    ids = torch.randint(5, 50, (2, 6))
    with ap.capture(model.eval()) as clean:
        model(input_ids=ids)
    with ap.capture(model.train()) as trained:
        out_a = model(input_ids=ids).last_hidden_state
    for a, b in zip(clean.maps, trained.maps, strict=True):
        # layer 0 sees the same input in both modes: its map is the softmax, not its dropout
        assert torch.allclose(a.pattern[0], b.pattern[0], atol=1e-6)
        assert torch.allclose(b.pattern.sum(-1), torch.ones(()), atol=1e-5)
    with torch.no_grad():
        torch.manual_seed(1)
        with ap.capture(model, layers=[0]):
            out_b = model(input_ids=ids).last_hidden_state
        torch.manual_seed(2)
        out_c = model(input_ids=ids).last_hidden_state
    assert not torch.allclose(out_a, out_b) and not torch.allclose(out_b, out_c)  # dropout ran


def test_generate_with_a_kv_cache_gives_one_padding_free_map_per_sequence():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=60, n_embd=16, n_layer=2, n_head=2, n_positions=32,
                        bos_token_id=0, eos_token_id=0, pad_token_id=0,
                        attn_implementation="sdpa")
    model = track(GPT2LMHeadModel(config).eval())
    ids = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])  # left padded
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    with torch.no_grad(), ap.capture(model) as cap:
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2,
                             do_sample=False)
    # the prompt forward and one cached step (the second new token is never fed back)
    assert len(cap.maps) == 2
    second = cap.maps[1]
    assert second.shape[-2:] == (3, 3) and second.prompt_length == 2
    assert second.key_tokens == ("9", "10", str(int(out[1, 4])))
    assert second.generated == (False, False, True)
    assert second.pattern[:, :, 0, 1:].abs().max() == 0  # causal: later keys exactly 0
    assert torch.allclose(second.pattern.sum(-1), torch.ones(()))


def test_stop_early_ends_the_forward_after_the_last_requested_layer(bert):
    ids = torch.randint(5, 50, (2, 6))
    calls = []
    handles = [bert.encoder.layer[i].intermediate.register_forward_hook(
        lambda *_, i=i: calls.append(i)) for i in range(2)]
    try:
        with torch.no_grad(), ap.capture(bert) as full:
            bert(input_ids=ids)
        assert calls == [0, 1]
        calls.clear()
        after = []
        with torch.no_grad(), ap.capture(bert, stop_early=True) as early:
            bert(input_ids=ids)
            after.append("ran")  # skipped: the forward stops inside
        assert calls == [0] and after == []  # layer 1's attention ran, its feed-forward not
        calls.clear()
        with torch.no_grad(), ap.capture(bert, layers=[0], stop_early=True) as first:
            bert(input_ids=ids)
        assert calls == []  # stopped inside layer 0, before its feed-forward
    finally:
        for handle in handles:
            handle.remove()
    for a, b in zip(full.maps, early.maps, strict=True):
        assert torch.equal(a.pattern, b.pattern)
    assert torch.equal(first.maps[0].pattern, full.maps[0].pattern[:1])
    assert bert.config._attn_implementation == "sdpa"


def test_stop_forward_is_not_swallowed_without_stop_early(bert):
    from attnprobe.capture.calls import StopForward

    with pytest.raises(StopForward), ap.capture(bert):
        raise StopForward


def test_output_edit_replaces_one_heads_output_and_must_change_something(bert):
    ids = torch.randint(5, 50, (2, 6))
    with torch.no_grad():
        plain = bert(input_ids=ids).last_hidden_state
        seen = {}

        def record(layer, output):  # [batch, head, query, d_head]
            seen[layer] = output.clone()
            return output

        with pytest.raises(ap.EditNotAppliedError), ap.capture(bert, edit_output=record):
            bert(input_ids=ids)
        assert seen[0].shape == (2, 2, 6, 8)

        def mean_ablate_head_1(layer, output):
            output = output.clone()
            output[:, 1] = output[:, 1].mean(dim=(0, 1), keepdim=True)
            return output

        with ap.capture(bert, layers=[1], edit_output=mean_ablate_head_1) as cap:
            edited = bert(input_ids=ids).last_hidden_state
    assert cap.edits["layer"].tolist() == [1]
    assert not torch.allclose(edited, plain)
    # by hand: layer 1's attention output with head 1 replaced by its mean, through the rest
    layer = bert.encoder.layer[1]
    with torch.no_grad():
        hidden = bert.embeddings(input_ids=ids)
        hidden = bert.encoder.layer[0](hidden)[0] if isinstance(
            bert.encoder.layer[0](hidden), tuple) else bert.encoder.layer[0](hidden)
        heads = seen[1]
        heads[:, 1] = heads[:, 1].mean(dim=(0, 1), keepdim=True)
        context = heads.transpose(1, 2).reshape(2, 6, 16)
        attended = layer.attention.output(context, hidden)
        expected = layer.output(layer.intermediate(attended), attended)
    assert torch.allclose(edited, expected, atol=1e-5)
