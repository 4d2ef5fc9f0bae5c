"""Readable tokens (issue 17): byte-level and SentencePiece markers turned back into text,
whitespace-only tokens shown visibly, special tokens and WordPiece left as they are."""

from __future__ import annotations

import json

import pytest
import torch

import attnprobe as ap
from attnprobe.core.tokens import (
    TOKEN_STYLES,
    byte_alphabet,
    guess_style,
    readable,
    readable_token,
    token_style,
)
from attnprobe.errors import FileFormatError, InputError
from attnprobe.models.tokenizer import WordTokenizer
from attnprobe.types import AttentionMap, ModelInfo
from tests.helpers import bert_tokenizer, bert_vocab


def _gpt2_bytes(text: str) -> str:
    """How GPT-2's byte-level BPE spells ``text``: each UTF-8 byte as its printable stand-in
    (built from the table GPT-2 publishes: bytes 33-126, 161-172, 174-255 map to themselves,
    the rest to 256, 257, ... in order)."""
    kept = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = {b: 256 + i for i, b in enumerate(b for b in range(256) if b not in kept)}
    return "".join(chr(b if b in kept else shifted[b]) for b in text.encode("utf-8"))


def test_the_byte_alphabet_is_gpt2s():
    table = byte_alphabet()
    assert len(table) == 256 and sorted(table.values()) == list(range(256))
    assert table["Ġ"] == 0x20 and table["Ċ"] == 0x0A and table["ĉ"] == 0x09
    assert all(table[_gpt2_bytes(chr(b))] == b for b in range(128))


@pytest.mark.parametrize("text", [" wooden", "The", " café", " 東京", "!", " naïve."])
def test_byte_level_tokens_read_as_their_text(text):
    assert readable_token(_gpt2_bytes(text), "byte_level") == text


def test_a_character_split_over_byte_level_tokens_shows_its_bytes_not_wrong_letters():
    first, second = _gpt2_bytes("é")  # two tokens, one byte each: 'Ã', '©'
    assert (first, second) == ("Ã", "©")
    assert readable([first, second], "byte_level") == ["\\xc3", "\\xa9"]


@pytest.mark.parametrize("style, token, shown", [
    ("byte_level", "Ġ", "␣"), ("byte_level", "ĠĠĠ", "␣␣␣"), ("byte_level", "Ċ", "⏎"),
    ("byte_level", "ĊĊ", "⏎⏎"), ("byte_level", "ĉ", "⇥"), ("byte_level", "čĊ", "␍⏎"),
    ("metaspace", "▁", "␣"), ("metaspace", "<0x0A>", "⏎"), ("metaspace", "<0x09>", "⇥"),
    ("plain", " ", "␣"), ("wordpiece", "\u3000", "␣"),
])
def test_a_token_of_only_whitespace_stays_visible(style, token, shown):
    assert readable_token(token, style) == shown


@pytest.mark.parametrize("style, token, shown", [
    ("metaspace", "▁the", " the"), ("metaspace", "▁▁x", "  x"), ("metaspace", "<0xE2>", "<0xE2>"),
    ("wordpiece", "##ing", "##ing"), ("wordpiece", "[CLS]", "[CLS]"),
    ("byte_level", "<|endoftext|>", "<|endoftext|>"), ("metaspace", "<s>", "<s>"),
    ("byte_level", "<｜begin▁of▁sentence｜>", "<｜begin▁of▁sentence｜>"),
    ("plain", "Ġcat", "Ġcat"),
])
def test_markers_are_read_by_style_and_special_tokens_stay(style, token, shown):
    assert readable_token(token, style) == shown


def test_the_style_of_stored_tokens_is_guessed_from_their_markers():
    assert guess_style(["The", "Ġcat"]) == "byte_level"
    assert guess_style(["<s>", "▁The"]) == "metaspace"
    assert guess_style(["[CLS]", "the", "##s"]) == "plain"
    assert readable(["Ġa", "Ċ"], None) == [" a", "⏎"]
    with pytest.raises(InputError, match="token style must be one of"):
        readable(["a"], "bpe")


def test_token_style_reads_the_tokenizer():
    assert token_style(bert_tokenizer(bert_vocab())) == "wordpiece"
    assert token_style(WordTokenizer()) == "plain"
    assert token_style(object()) == "plain"
    assert set(TOKEN_STYLES) == {"byte_level", "metaspace", "wordpiece", "plain"}


def _map(tokens: tuple[str, ...], style: str | None) -> AttentionMap:
    n = len(tokens)
    info = ModelInfo(name="toy", arch="toy", n_layers=1, n_heads=1, causal=True,
                     token_style=style)
    pattern = torch.tril(torch.ones(n, n))
    return AttentionMap(pattern=(pattern / pattern.sum(-1, keepdim=True))[None, None],
                        query_tokens=tokens, key_tokens=tokens, layers=(0,), info=info,
                        query_ids=tuple(range(n)), key_ids=tuple(range(n)))


def test_maps_keep_raw_tokens_and_show_readable_ones_also_after_a_round_trip(tmp_path):
    raw = ("The", "Ġwooden", "Ċ", "Ġ")
    amap = _map(raw, "byte_level")
    assert amap.query_tokens == raw
    assert amap.readable_tokens() == ("The", " wooden", "⏎", "␣")
    assert list(amap.to_frame().drop_duplicates("query_pos").query_token) == \
        ["The", " wooden", "⏎", "␣"]
    ap.save_maps([amap], tmp_path / "m.npz")
    back = ap.load_maps(tmp_path / "m.npz")[0]
    assert back.query_tokens == raw and back.info.token_style == "byte_level"
    assert back.readable_tokens("key") == amap.readable_tokens("key")
    # a recorded style wins over the guess: a plain tokenizer's "Ġ" is a letter
    assert _map(raw, "plain").readable_tokens() == ("The", "Ġwooden", "Ċ", "Ġ")
    assert "Ġ" not in repr(amap)


def test_an_unknown_style_is_refused_in_code_and_in_files(tmp_path):
    with pytest.raises(InputError, match="token_style must be one of"):
        ModelInfo(name="toy", arch="toy", n_layers=1, n_heads=1, causal=True, token_style="x")
    ap.save_maps([_map(("a", "b"), "plain")], tmp_path / "m.npz")
    sidecar = tmp_path / "m.json"
    spec = json.loads(sidecar.read_text())
    spec["maps"][0]["info"]["token_style"] = "bpe"
    sidecar.write_text(json.dumps(spec))
    with pytest.raises(FileFormatError, match="token_style must be one of"):
        ap.load_maps(tmp_path / "m.npz")
