"""The original (post-norm) encoder–decoder Transformer: three attention kinds captured per
example with padding stripped on the right sides, causality of the decoder, padding invariance,
post-norm structure and the paper's base sizes."""

from __future__ import annotations

import pytest
import torch

import attnprobe
import attnprobe.models.encoder_decoder  # registers "encoder-decoder"
from attnprobe.errors import InputError
from attnprobe.models.encoder_decoder import EncoderDecoderConfig, EncoderDecoderModel
from attnprobe.models.zoo import build_reference
from tests.conftest import track

SOURCES = ["The cat sat on the mat.", "A dog ran."]
TARGETS = ["a cat", "the dog ran home to the big house"]


@pytest.fixture(scope="module")
def built():
    return build_reference("encoder-decoder")


def _inputs(tok, src_side="right", tgt_side="left", sources=SOURCES, targets=TARGETS):
    src, tgt = tok(sources, padding_side=src_side), tok(targets, padding_side=tgt_side)
    return {"input_ids": src["input_ids"], "attention_mask": src["attention_mask"],
            "decoder_input_ids": tgt["input_ids"], "decoder_attention_mask": tgt["attention_mask"]}


def _run(model, batch, **kwargs):
    with torch.no_grad(), attnprobe.capture(track(model), **kwargs) as cap:
        logits = model(**batch)
    return logits, cap.maps


def test_capture_gives_three_maps_per_example_with_padding_stripped(built):
    model, tok = built
    assert model.config.is_encoder_decoder is True
    assert model.attnprobe_name == "encoder-decoder"
    _, maps = _run(model, _inputs(tok))
    assert len(maps) == 3 * len(SOURCES)
    layers, heads = model.config.n_layers, model.config.n_heads
    for b, (source, target) in enumerate(zip(SOURCES, TARGETS, strict=True)):
        enc, dec, cross = maps[3 * b : 3 * b + 3]
        src, tgt = len(tok.encode(source)), len(tok.encode(target))
        assert (enc.kind, dec.kind, cross.kind) == ("self", "self", "cross")
        assert (enc.stack, dec.stack, cross.stack) == ("encoder.blocks",) + ("decoder.blocks",) * 2
        assert enc.pattern.shape == (layers, heads, src, src)
        assert dec.pattern.shape == (layers, heads, tgt, tgt)
        assert cross.pattern.shape == (layers, heads, tgt, src)
        # no tokenizer given to capture: tokens are the ids of the real (unpadded) tokens
        assert cross.query_tokens == dec.query_tokens == tuple(map(str, tok.encode(target)))
        assert cross.key_tokens == enc.key_tokens == tuple(map(str, tok.encode(source)))
        upper = torch.ones(tgt, tgt, dtype=torch.bool).triu(1)
        assert (dec.pattern[..., upper] == 0).all()  # decoder self-attention is causal
        enc_upper = torch.ones(src, src, dtype=torch.bool).triu(1)
        assert (enc.pattern[..., enc_upper] > 0).all()  # the encoder is not
        assert (cross.pattern > 0).all()  # every target position sees every source token


def test_padded_batches_match_each_pair_alone(built):
    model, tok = built
    alone = [_run(model, _inputs(tok, sources=[s], targets=[t]))
             for s, t in zip(SOURCES, TARGETS, strict=True)]
    for sides in (("right", "left"), ("left", "right")):
        batch = _inputs(tok, *sides)
        logits, maps = _run(model, batch)
        for b, (alone_logits, alone_maps) in enumerate(alone):
            real = batch["decoder_attention_mask"][b].bool()
            torch.testing.assert_close(logits[b, real], alone_logits[0], atol=1e-5, rtol=1e-5)
            for got, want in zip(maps[3 * b : 3 * b + 3], alone_maps, strict=True):
                torch.testing.assert_close(got.pattern, want.pattern, atol=1e-6, rtol=1e-5)


def test_a_target_position_ignores_later_target_tokens_but_sees_the_whole_source(built):
    model, tok = built
    batch = _inputs(tok, sources=["the cat sat on the mat"], targets=["the dog ran home"])
    dog = tok.convert_tokens_to_ids(["dog"])[0]
    with torch.no_grad():
        clean = model(**batch)
        later = dict(batch, decoder_input_ids=batch["decoder_input_ids"].clone())
        later["decoder_input_ids"][0, 3] = dog  # change target token 3 ("ran")
        changed_target = model(**later)
        source = dict(batch, input_ids=batch["input_ids"].clone())
        source["input_ids"][0, -1] = dog  # change the last source token
        changed_source = model(**source)
    torch.testing.assert_close(changed_target[0, :3], clean[0, :3], atol=0, rtol=0)
    assert (changed_target[0, 3:] - clean[0, 3:]).abs().max() > 1e-4
    assert ((changed_source[0] - clean[0]).abs().amax(-1) > 1e-4).all()


def test_blocks_are_post_norm():
    model = EncoderDecoderModel(EncoderDecoderConfig(vocab_size=20)).eval()
    x, real = torch.randn(2, 5, 32) * 3 + 1, torch.ones(2, 5, dtype=torch.bool)
    with torch.no_grad():
        enc = model.encoder.blocks[0](x, real)
        dec = model.decoder.blocks[0](x, torch.randn(2, 4, 32), torch.ones(2, 4, dtype=torch.bool),
                                      real)
    for out in (enc, dec):  # a fresh LayerNorm is the last thing applied: mean 0, variance 1
        torch.testing.assert_close(out.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
        torch.testing.assert_close(out.var(-1, unbiased=False), torch.ones(2, 5), atol=1e-3,
                                   rtol=0)


def test_editing_cross_attention_changes_the_logits(built):
    model, tok = built
    batch = _inputs(tok)
    point = model.get_submodule("decoder.blocks.1.cross_attn.hook_pattern")
    with torch.no_grad():
        clean = model(**batch)
        handle = point.register_forward_hook(lambda m, i, o: torch.full_like(o, 1 / o.shape[-1]))
        try:
            edited = model(**batch)
        finally:
            handle.remove()
    assert (edited - clean).abs().max() > 1e-3


def test_original_sizes_have_eight_heads_of_64():
    with torch.device("meta"):  # shapes only; nothing is allocated or run
        model = EncoderDecoderModel.original(vocab_size=1000)
    config = model.config
    assert (config.d_model, config.n_heads, config.d_ff, config.n_layers) == (512, 8, 2048, 6)
    assert len(model.encoder.blocks) == len(model.decoder.blocks) == 6
    for attn in (model.encoder.blocks[5].attn, model.decoder.blocks[0].self_attn,
                 model.decoder.blocks[0].cross_attn):
        assert (attn.n_heads, attn.d_head) == (8, 64)
        assert attn.q_proj.weight.shape == attn.k_proj.weight.shape == (8 * 64, 512)
        assert attn.out_proj.weight.shape == (512, 8 * 64)
    assert model.encoder.blocks[0].ffn.fc_in.weight.shape == (2048, 512)


def test_bad_inputs_raise(built):
    model, tok = built
    batch = _inputs(tok)
    with pytest.raises(InputError, match="decoder_input_ids is required"):
        model(batch["input_ids"], batch["attention_mask"])
    with pytest.raises(InputError, match=r"batch 2 .* batch 1"):
        model(**dict(batch, decoder_input_ids=batch["decoder_input_ids"][:1],
                     decoder_attention_mask=batch["decoder_attention_mask"][:1]))
    with pytest.raises(InputError, match="fully masked"):
        model(**dict(batch, decoder_attention_mask=torch.zeros_like(
            batch["decoder_attention_mask"])))
    with pytest.raises(InputError, match=r"d_model=30 .* n_heads=4"):
        EncoderDecoderConfig(vocab_size=10, d_model=30)
