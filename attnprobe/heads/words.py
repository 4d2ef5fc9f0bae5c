"""From sub-word tokens to words: align token strings to words, pool attention to word level.

Clark et al. (2019, §4.1) turn token attention into word attention by *summing* the attention
**to** a word's pieces and *averaging* the attention **from** its pieces, which keeps rows
summing to 1. :func:`to_words` does this with pooling matrices (no loop over tokens);
:func:`align_tokens` finds which word each stored token belongs to without a tokenizer.
"""

from __future__ import annotations

import codecs
import unicodedata
from collections.abc import Collection, Sequence

import torch

from attnprobe.core.registry import one_of
from attnprobe.core.tokens import UNKNOWN_TOKENS, byte_alphabet, looks_special
from attnprobe.errors import InputError

TO_AGGS = ("sum", "mean", "max")
FROM_AGGS = ("mean", "first", "max")


# ------------------------------------------------------------------------------------- pooling
def _masked_max(values: torch.Tensor, member: torch.Tensor, dim: int) -> torch.Tensor:
    """Max of ``values`` over ``dim`` among ``member`` entries; 0 where there is none."""
    low = torch.finfo(values.dtype).min
    out = torch.where(member, values, low).amax(dim)
    return torch.where(member.any(dim), out, 0.0)


def _pool(pattern: torch.Tensor, token_word: torch.Tensor, n_words: int, to_agg: str,
          from_agg: str) -> torch.Tensor:
    """``[batch, m, token, token]`` with ``[batch, token]`` -> ``[batch, m, word, word]``."""
    dtype = pattern.dtype
    member = token_word[:, :, None] == torch.arange(n_words, device=token_word.device)
    onehot = member.to(dtype)  # [batch, token, word]
    size = onehot.sum(1, keepdim=True).clamp(min=1)  # [batch, 1, word] pieces per word
    if to_agg == "max":  # [batch, m, q, token, word] -> [batch, m, q, word]
        to = _masked_max(pattern[..., None], member[:, None, None], dim=-2)
    else:
        pool = onehot if to_agg == "sum" else onehot / size
        to = torch.einsum("bmqt,btw->bmqw", pattern, pool)
    if from_agg == "max":  # [batch, m, token, 1, word] over tokens of each word
        return _masked_max(to[..., None, :], member[:, None, :, :, None], dim=-3)
    if from_agg == "first":
        index = torch.arange(token_word.shape[1], device=token_word.device)
        first = torch.where(member, index[None, :, None], token_word.shape[1]).amin(1)
        pool = (index[None, :, None] == first[:, None, :]).to(dtype)  # [batch, token, word]
    else:
        pool = onehot / size
    return torch.einsum("btv,bmtw->bmvw", pool, to)


def to_words(pattern: torch.Tensor, token_word: torch.Tensor, n_words: int, *,
             to_agg: str = "sum", from_agg: str = "mean") -> torch.Tensor:
    """Token-level attention to word-level attention.

    Args:
        pattern: ``[..., query_token, key_token]`` self-attention over one example (any
            leading dims, e.g. ``[layer, head, q, k]``); or, batched, ``[batch, ..., q, k]``.
        token_word: LongTensor ``[token]`` giving each token's word index, -1 for tokens to
            drop (``[CLS]``, ``[SEP]``, padding); batched: ``[batch, token]``.
        n_words: number of words (batched: the most words in any example).
        to_agg: attention **to** a word from its pieces: ``sum`` (Clark; keeps rows summing
            to 1 when no token is dropped), ``mean`` or ``max``.
        from_agg: attention **from** a word: ``mean`` over its pieces' rows (Clark's paper),
            ``first`` piece (Clark's released code) or elementwise ``max``.

    Returns:
        ``[..., word, word]`` (batched ``[batch, ..., word, word]``) in ``pattern``'s dtype.
        Rows and columns of words with no token (e.g. past an example's last word) are 0.
        ``sum``/``mean``/``first`` are matrix products with pooling matrices; ``max`` builds
        a ``[..., q, token, word]`` intermediate, so it needs more memory on long inputs.

    Example:
        >>> token_word = torch.tensor([-1, 0, 1, 1, -1])    # [CLS] a mail ##man [SEP]
        >>> uniform = torch.full((1, 1, 5, 5), 0.2)         # [layer, head, query, key]
        >>> to_words(uniform, token_word, 2)    # to a word: summed; from a word: averaged
        tensor([[[[0.2000, 0.4000],
                  [0.2000, 0.4000]]]])
        >>> words = torch.tensor(align_tokens(maps[1].query_tokens, trees[1].words))
        >>> to_words(maps[1].pattern, words, len(trees[1])).shape   # [layer, head, word, word]
        torch.Size([6, 12, 7, 7])
    """
    if to_agg not in TO_AGGS:
        raise InputError(one_of("to_agg", to_agg, TO_AGGS))
    if from_agg not in FROM_AGGS:
        raise InputError(one_of("from_agg", from_agg, FROM_AGGS))
    if not isinstance(pattern, torch.Tensor) or not pattern.is_floating_point():
        raise InputError("pattern must be a floating-point tensor [..., query, key]")
    if not isinstance(token_word, torch.Tensor) or token_word.dtype not in (
            torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise InputError("token_word must be an integer tensor [token] or [batch, token]")
    if isinstance(n_words, bool) or not isinstance(n_words, int) or n_words < 1:
        raise InputError(f"n_words must be a positive integer; got {n_words!r}")
    batched = token_word.ndim == 2
    if token_word.ndim not in (1, 2) or pattern.ndim < 2 + batched:
        raise InputError(f"token_word {tuple(token_word.shape)} must be [token] with pattern "
                         f"[..., q, k], or [batch, token] with pattern [batch, ..., q, k]; "
                         f"pattern is {tuple(pattern.shape)}")
    n_tokens = token_word.shape[-1]
    if pattern.shape[-1] != n_tokens or pattern.shape[-2] != n_tokens or (
            batched and pattern.shape[0] != token_word.shape[0]):
        raise InputError(f"pattern {tuple(pattern.shape)} does not match token_word "
                         f"{tuple(token_word.shape)} (self-attention over the same tokens)")
    if token_word.numel() and (token_word.min() < -1 or token_word.max() >= n_words):
        raise InputError(f"token_word values must lie in -1..{n_words - 1}")
    token_word = token_word.to(pattern.device, torch.int64)
    if not batched:
        token_word, pattern = token_word[None], pattern[None]
    lead = pattern.shape[1:-2]
    flat = pattern.reshape(pattern.shape[0], -1, n_tokens, n_tokens)
    out = _pool(flat, token_word, n_words, to_agg, from_agg)
    out = out.reshape(pattern.shape[0], *lead, n_words, n_words)
    return out if batched else out[0]


# ----------------------------------------------------------------------------------- alignment
def normalise(text: str) -> str:
    """Text as compared by :func:`align_tokens`: lower-case, accents stripped, no spaces
    (as BERT's uncased basic tokenizer does)."""
    decomposed = unicodedata.normalize("NFD", text.lower())
    return "".join(ch for ch in decomposed  # marks, control/format characters, spaces go
                   if unicodedata.category(ch) not in ("Mn", "Cc", "Cf") and not ch.isspace())


def _token_texts(tokens: Sequence[str], skip: Collection[str]) -> list[str]:
    """Surface text of each token with sub-word markers removed (byte-level BPE decoded)."""
    texts = []
    if any("Ġ" in t for t in tokens):  # GPT-2 / RoBERTa byte-level tokens
        decoder, table = codecs.getincrementaldecoder("utf-8")(errors="replace"), byte_alphabet()
        for token in tokens:
            if token in skip:
                texts.append("")
                continue
            raw = b"".join(bytes([table[c]]) if c in table else c.encode() for c in token)
            texts.append(decoder.decode(raw))
        return [normalise(t) for t in texts]
    for token in tokens:
        text = token[2:] if token.startswith("##") else token
        text = text[:-4] if text.endswith("</w>") and len(text) > 4 else text
        texts.append(normalise(text.replace("▁", " ")))
    return texts


def align_tokens(tokens: Sequence[str], words: Sequence[str], *,
                 special: Collection[str] | None = None,
                 unknown: Collection[str] = UNKNOWN_TOKENS,
                 sentence_id: str = "") -> list[int]:
    """The word index of each token, by greedy character matching; -1 for special tokens.

    Tokens and words are compared after :func:`normalise` (lower-case, accents stripped via
    NFD, spaces dropped) and after removing sub-word markers: WordPiece ``##``, byte-level BPE
    ``Ġ`` (GPT-2/RoBERTa tokens are byte-decoded), SentencePiece ``▁``, BPE ``</w>``.

    - A token belongs to the word where its first character lies; a token that runs into the
      next word is allowed as long as that word still gets a token of its own.
    - An ``unknown`` token (``[UNK]``) consumes the rest of the current word (or the whole
      next word).
    - A token with no characters left (a bare ``▁``) goes to the next word, or -1 at the end.

    Args:
        tokens: stored token strings, e.g. ``AttentionMap.query_tokens``.
        words: the tree's words.
        special: tokens that belong to no word (-1); default: every token spelled like a
            special token (:func:`attnprobe.core.tokens.looks_special`).
        unknown: tokens that stand for an unknown word (``[UNK]``).
        sentence_id: named in error messages.

    Raises:
        InputError: the characters do not match, tokens are left over, or words are missing.

    Example:
        >>> align_tokens(["[CLS]", "the", "mail", "##man", ".", "[SEP]"],
        ...              ["The", "mailman", "."])
        [-1, 0, 1, 1, 2, -1]
        >>> align_tokens(["Ġthe", "Ġmail", "man"], ["The", "mailman"])   # GPT-2's tokens
        [0, 1, 1]
    """
    where = f"sentence {sentence_id}" if sentence_id else "sentence"
    targets = [normalise(w) for w in words]
    if not targets:
        raise InputError(f"{where}: no words to align the tokens to")
    for i, target in enumerate(targets):
        if not target:
            raise InputError(f"{where}: word {i} {words[i]!r} has no characters to match")
    if special is None:
        special = {t for t in tokens if looks_special(t)}
    texts = _token_texts(tokens, set(special))
    out: list[int] = []
    w, c = 0, 0  # current word, characters of it consumed
    for t, (token, text) in enumerate(zip(tokens, texts, strict=True)):
        if token in special:
            out.append(-1)
            continue
        while w < len(targets) and c == len(targets[w]):
            w, c = w + 1, 0
        if w == len(targets):
            if text or token in unknown:
                raise InputError(f"{where}: token {t} {token!r} is left over after the last "
                                 f"word {words[-1]!r}")
            out.append(-1)
            continue
        out.append(w)
        if token in unknown:
            c = len(targets[w])
            continue
        rest = text
        while rest:
            while w < len(targets) and c == len(targets[w]):
                w, c = w + 1, 0
            if w == len(targets):
                raise InputError(f"{where}: token {t} {token!r} runs past the last word "
                                 f"{words[-1]!r}")
            take = min(len(rest), len(targets[w]) - c)
            if rest[:take] != targets[w][c:c + take]:
                shown = list(tokens[max(0, t - 2):t + 1])
                raise InputError(f"{where}: tokens {shown} do not match word {w} {words[w]!r}")
            c, rest = c + take, rest[take:]
    while w < len(targets) and c == len(targets[w]):
        w, c = w + 1, 0
    if w < len(targets):
        raise InputError(f"{where}: tokens end before word {w} {words[w]!r} is complete")
    owned = set(out)
    missing = [i for i in range(len(words)) if i not in owned]
    if missing:
        i = missing[0]
        raise InputError(f"{where}: word {i} {words[i]!r} gets no token of its own (the "
                         "token before it runs over it)")
    return out
