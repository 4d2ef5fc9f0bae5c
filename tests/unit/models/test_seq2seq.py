"""GRU encoder–decoders: registry, cross-attention capture, padding invariance, greedy
generation, the edit seam, input errors and a tiny copy-task overfit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnprobe
import attnprobe.models.seq2seq  # registers the rnn-* models
from attnprobe.capture import hook_point_paths
from attnprobe.errors import AttentionUnavailableError, InputError
from attnprobe.models import REFERENCE_MODELS, build_reference
from attnprobe.models.seq2seq import Seq2Seq, Seq2SeqConfig
from attnprobe.tasks import make_batch
from tests.conftest import track

NAMES = {"rnn-seq2seq": "none", "rnn-bahdanau": "bahdanau", "rnn-luong": "luong-general"}
ALL_KINDS = ["none", "bahdanau", "luong-dot", "luong-general", "luong-concat",
             "luong-local-m", "luong-local-p"]
TEXTS = ["the cat sat on the mat", "a dog ran"]


def _pad(rows: list[list[int]], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids, mask = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width)
    for b, row in enumerate(rows):
        span = slice(0, len(row)) if side == "right" else slice(width - len(row), width)
        ids[b, span], mask[b, span] = torch.tensor(row), 1
    return ids, mask.long()


def _small(attention: str, seed: int = 0) -> Seq2Seq:
    torch.manual_seed(seed)
    return track(Seq2Seq(Seq2SeqConfig(vocab_size=20, d_embed=8, d_hidden=16,
                                       attention=attention, local_window=1)))


def test_registry_names_configs_and_the_fixed_context_model_has_nothing_to_capture():
    assert set(NAMES) <= set(REFERENCE_MODELS.names())
    for name, kind in NAMES.items():
        model, tok = attnprobe.load_model(f"ref:{name}")
        assert model.attnprobe_name == name and not model.training
        config = model.config
        assert config.attention == kind and config.is_encoder_decoder and not config.causal
        assert config.vocab_size == len(tok)
        heads = 0 if kind == "none" else 1
        assert (config.n_layers, config.n_heads) == (heads, heads)
        assert hook_point_paths(model) == ([] if kind == "none"
                                           else ["decoder.cross_attn.hook_pattern"])
    model = track(build_reference("rnn-seq2seq")[0])
    assert not hasattr(model.decoder, "cross_attn")
    with pytest.raises(AttentionUnavailableError), attnprobe.capture(model):
        model(torch.tensor([[3, 4]]), decoder_input_ids=torch.tensor([[1, 3]]))


@pytest.mark.parametrize("name", ["rnn-bahdanau", "rnn-luong"])
def test_capture_gives_one_cross_map_per_example_with_padding_stripped(name):
    model, tok = build_reference(name)
    model = track(model)
    src = tok(TEXTS)  # right-padded: lengths 7 and 4
    dec_ids, dec_mask = _pad([[2, 5, 6], [2, 7, 8, 9, 10]], "right")
    rows = []  # an independent read of the hook, one [batch, 1, 1, src] tensor per step
    handle = model.decoder.cross_attn.hook_pattern.register_forward_hook(
        lambda m, a, out: rows.append(out.detach().clone()))
    try:
        model(**src, decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask)
    finally:
        handle.remove()
    assert len(rows) == dec_ids.shape[1]  # fired once per decoder step
    assert all(r.shape == (2, 1, 1, src["input_ids"].shape[1]) for r in rows)

    with attnprobe.capture(model, tokenizer=tok) as cap:
        model(**src, decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask)
    assert [m.shape for m in cap.maps] == [(1, 1, 3, 7), (1, 1, 5, 4)]
    assert all(m.kind == "cross" for m in cap.maps)
    assert cap.maps[1].key_tokens == ("[BOS]", "a", "dog", "ran")
    full = torch.cat(rows, dim=2)  # [batch, 1, tgt, src]
    assert torch.allclose(cap.maps[0].pattern[0], full[0, :, :3, :7])
    assert torch.allclose(cap.maps[1].pattern[0], full[1, :, :5, :4])


@pytest.mark.parametrize("attention", ALL_KINDS)
def test_padding_on_either_side_leaves_real_logits_unchanged(attention):
    model = _small(attention)
    sources, targets = [[3, 4, 5, 6, 7, 8], [9, 10, 11]], [[1, 3, 4], [1, 9, 10, 11, 12]]
    alone = [model(torch.tensor([s]), decoder_input_ids=torch.tensor([t]))[0]
             for s, t in zip(sources, targets, strict=True)]
    for side in ("right", "left"):
        ids, mask = _pad(sources, side)
        dec, dec_mask = _pad(targets, side)
        logits = model(ids, mask, dec, dec_mask)
        assert logits.shape == (2, dec.shape[1], 20)
        for b, expected in enumerate(alone):
            real = dec_mask[b].bool()
            assert torch.allclose(logits[b, real], expected, atol=1e-5), (side, b)


def test_local_attention_variants_are_captured_and_check_their_window():
    for attention in ("luong-local-m", "luong-local-p"):
        model = _small(attention)
        with attnprobe.capture(model) as cap:
            model(torch.tensor([[3, 4, 5, 6]]), decoder_input_ids=torch.tensor([[1, 3, 4]]))
        assert cap.maps[0].shape == (1, 1, 3, 4) and cap.maps[0].kind == "cross"
        with pytest.raises(InputError, match="larger than the source"):
            model(torch.tensor([[3, 4]]), decoder_input_ids=torch.tensor([[1, 3]]))


def test_an_edit_through_the_hook_changes_the_logits():
    model = _small("bahdanau")
    src, dec = torch.tensor([[3, 4, 5, 6]]), torch.tensor([[1, 3, 4]])
    before = model(src, decoder_input_ids=dec)
    first_key = torch.zeros(1, 1, 1, 4)
    first_key[..., 0] = 1
    handle = model.decoder.cross_attn.hook_pattern.register_forward_hook(
        lambda m, a, out: first_key)
    try:
        after = model(src, decoder_input_ids=dec)
    finally:
        handle.remove()
    assert not torch.allclose(before, after)


@pytest.mark.parametrize("attention", ["none", "bahdanau", "luong-concat"])
def test_greedy_generate_agrees_with_teacher_forcing_on_its_own_output(attention):
    model = _small(attention, seed=3)
    ids, mask = _pad([[3, 4, 5, 6, 7], [8, 9, 10]], "right")
    out = model.generate(ids, mask, max_new_tokens=6, bos_id=1, eos_id=2)
    assert out.dtype == torch.long and out.shape[0] == 2 and 1 <= out.shape[1] <= 6
    for b in range(2):
        row = out[b].tolist()
        row = row[: row.index(2) + 1] if 2 in row else row
        dec = torch.tensor([[1, *row[:-1]]])
        logits = model(ids[b:b + 1, mask[b].bool()], decoder_input_ids=dec)
        assert logits[0].argmax(-1).tolist() == row


def test_bad_inputs_raise_input_error():
    model = _small("bahdanau")
    src = torch.tensor([[3, 4, 5]])
    with pytest.raises(InputError, match="decoder_input_ids is required"):
        model(src)
    with pytest.raises(InputError, match="examples"):
        model(src, decoder_input_ids=torch.tensor([[1], [1]]))
    with pytest.raises(InputError, match="must lie in"):
        model(torch.tensor([[3, 99]]), decoder_input_ids=torch.tensor([[1]]))
    with pytest.raises(InputError, match="no real token"):
        model(src, torch.zeros(1, 3), decoder_input_ids=torch.tensor([[1]]))
    with pytest.raises(InputError, match="attention must be one of"):
        Seq2SeqConfig(vocab_size=5, attention="luong")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="max_new_tokens"):
        model.generate(src, max_new_tokens=0)


def test_attention_model_overfits_eight_copy_examples():
    batch = make_batch("copy", 8, min_len=5, max_len=5, vocab_size=16, seed=0)
    torch.manual_seed(0)
    model = Seq2Seq(Seq2SeqConfig(vocab_size=16, d_embed=16, d_hidden=32, attention="bahdanau"))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: extra threads only add contention (~2 s on one)
    try:
        for _ in range(200):
            logits = model(**batch.model_inputs())
            loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=0)
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        predicted = model.eval()(**batch.model_inputs()).argmax(-1)
    real = batch.labels != 0
    assert (predicted == batch.labels)[real].float().mean() >= 0.95


def test_scores_of_a_step_decoder_are_appended_like_patterns():
    model, tok = build_reference("rnn-bahdanau")
    model = track(model)
    source = tok(["the cat sat on the mat", "a dog"])
    target = tok(["the cat", "a dog ran"])
    with attnprobe.capture(model, scores=True) as cap:
        model(input_ids=source["input_ids"], attention_mask=source["attention_mask"],
              decoder_input_ids=target["input_ids"],
              decoder_attention_mask=target["attention_mask"])
    for amap in cap.maps:
        assert amap.scores.shape == amap.pattern.shape
        assert torch.allclose(torch.softmax(amap.scores, -1), amap.pattern, atol=1e-6)
