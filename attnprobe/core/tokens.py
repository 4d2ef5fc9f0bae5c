"""Token classes, defined once: special tokens (by tokenizer or by spelling) and punctuation.

- A tokenizer's **special tokens** are its ``all_special_ids`` plus the ids of its role tokens
  (``cls``, ``sep``, ``bos``, ``eos``), *without* the unknown token: ``[UNK]`` stands for a
  word of the text, and every analysis treats it as one.
- Without a tokenizer (stored maps), a token is special when it is spelled like one:
  ``[CLS]``, ``[unused0]``, ``<s>``, ``</s>``, ``<|endoftext|>``, ``<pad>`` ... — bracketed,
  with no space inside; SentencePiece byte tokens such as ``<0x0A>`` and the unknown tokens
  are not.
- **Punctuation** is a token made only of punctuation or symbols once a sub-word marker
  (WordPiece ``##``, byte-level BPE ``Ġ``, SentencePiece ``▁``) is removed: ``.``, ``##,``,
  ``Ġ--``, ``?!``, ``$`` (Clark et al. count ``.`` and ``,``).
- A tokenizer's **template** is what ``tokenizer(text)`` puts around the tokens of one text
  (its post-processor): ``[CLS] … [SEP]`` for BERT, ``<s> …`` for LLaMA, nothing for GPT-2,
  ``[BOS] …`` for attnprobe's word tokenizer. :func:`special_template` reads it off the
  tokenizer's own output, since transformers 5 tokenizers no longer have
  ``build_inputs_with_special_tokens``. It has a **pair template** (:func:`has_pair_template`)
  when a sentence pair is not two single texts back to back (BERT's ``[CLS] a [SEP] b
  [SEP]``; not GPT-2's nothing, nor LLaMA's second ``<s>``).
- **Readable tokens** (:func:`readable`): what people are shown. A tokenizer's *style*
  (:data:`TOKEN_STYLES`, read once from the tokenizer by :func:`token_style` and recorded with
  the maps) says how its token strings spell text: ``byte_level`` (GPT-2, RoBERTa, LLaMA 3:
  ``Ġwooden`` is `` wooden``, ``Ċ`` a newline, every other character one byte of UTF-8),
  ``metaspace`` (SentencePiece: ``▁`` is a space, ``<0x0A>`` the byte 0x0A), ``wordpiece``
  (BERT: ``##ing`` is readable as it is) and ``plain``. A token that is only whitespace is
  shown visibly (``␣``, ``⏎``, ``⇥``), so it never disappears; special tokens stay as they are.
  The raw strings stay in the data and files.
"""

from __future__ import annotations

import codecs
import functools
import re
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnprobe.errors import InputError

__all__ = [
    "SPECIAL_ROLES",
    "TOKEN_STYLES",
    "UNKNOWN_TOKENS",
    "TokenVocabulary",
    "VocabularyIds",
    "byte_alphabet",
    "guess_style",
    "has_pair_template",
    "is_punctuation",
    "looks_special",
    "readable",
    "readable_token",
    "special_ids",
    "special_template",
    "special_tokens",
    "token_classes",
    "token_style",
    "vocabulary_ids",
]

SPECIAL_ROLES = ("cls", "sep", "bos", "eos")
UNKNOWN_TOKENS = ("[UNK]", "<unk>", "<|unk|>")
# How each role is usually spelled, for maps stored without their tokenizer.
ROLE_SPELLINGS = {
    "cls": ("[CLS]",),
    "sep": ("[SEP]",),
    "bos": ("<s>", "[BOS]", "<bos>", "<|begin_of_text|>", "<|startoftext|>"),
    "eos": ("</s>", "[EOS]", "<eos>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>"),
}

_SPECIAL_SPELLING = re.compile(r"^(?:\[[^\s\[\]]+\]|<(?!0x[0-9a-fA-F]{2}>)[^\s<>]+>)$")
_PUNCTUATION = re.compile(r"^(?:##|Ġ|▁)?[^\w\s]+$|^(?:##|Ġ|▁)?_+$")


def looks_special(token: str) -> bool:
    """Whether a token string is spelled like a special token (module docstring)."""
    return bool(_SPECIAL_SPELLING.match(token)) and token not in UNKNOWN_TOKENS


def is_punctuation(token: str) -> bool:
    """Whether a token is only punctuation or symbols (module docstring)."""
    return bool(_PUNCTUATION.match(token))


def _role_ids(tokenizer: Any) -> dict[str, int]:
    """Role -> id for the roles the tokenizer has; a role sharing its id with an earlier one
    (GPT-2's eos is its bos) is left out."""
    roles: dict[str, int] = {}
    for role in SPECIAL_ROLES:
        token_id = getattr(tokenizer, f"{role}_token_id", None)
        if isinstance(token_id, int) and not isinstance(token_id, bool) \
                and token_id not in roles.values():
            roles[role] = token_id
    return roles


def special_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special tokens, the unknown token excluded."""
    ids = {int(i) for i in (getattr(tokenizer, "all_special_ids", None) or [])}
    ids |= set(_role_ids(tokenizer).values())
    unk = getattr(tokenizer, "unk_token_id", None)
    return ids - {unk} if isinstance(unk, int) else ids


def special_tokens(tokenizer: Any) -> set[str]:
    """The strings of :func:`special_ids`."""
    ids = sorted(special_ids(tokenizer))
    if not ids:
        return set()
    tokens = tokenizer.convert_ids_to_tokens(ids)
    return {str(t) for t in (tokens if isinstance(tokens, list) else [tokens])}


@dataclass(frozen=True)
class VocabularyIds:
    """What a scan of a tokenizer's whole vocabulary finds, as sorted id tensors.

    Attributes:
        punctuation: tokens spelled as punctuation (:func:`is_punctuation`).
        plain: tokens neither spelled like a special token (:func:`looks_special`) nor blank.
    """

    punctuation: torch.Tensor
    plain: torch.Tensor


# tokenizer -> (vocabulary size, its scan): the scan reads every token (tens of thousands of
# regular-expression matches), so it runs once per tokenizer and size (added tokens rescan)
_SCANS: weakref.WeakKeyDictionary[Any, tuple[int, VocabularyIds]] = weakref.WeakKeyDictionary()


def vocabulary_ids(tokenizer: Any) -> VocabularyIds:
    """The scan of ``tokenizer``'s vocabulary (:class:`VocabularyIds`), computed once per
    tokenizer and vocabulary size.

    Example:
        >>> found = vocabulary_ids(tok)                 # MiniLM's BERT tokenizer
        >>> tok.convert_tokens_to_ids(".") in found.punctuation.tolist()
        True
        >>> tok.cls_token_id in found.plain.tolist()    # [CLS] is spelled like a special
        False
    """
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else None
    try:
        known = _SCANS.get(tokenizer)
    except TypeError:  # no weak reference to it: scanned every time
        known = None
    if known is not None and size is not None and known[0] == size:
        return known[1]
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    scan = VocabularyIds(
        _id_tensor(i for tok, i in vocab.items() if is_punctuation(tok)),
        _id_tensor(i for tok, i in vocab.items() if tok.strip() and not looks_special(tok)))
    if size is not None:
        try:
            _SCANS[tokenizer] = (size, scan)
        except TypeError:
            pass
    return scan


def _id_tensor(values: Iterable[int]) -> torch.Tensor:
    return torch.as_tensor(sorted({int(v) for v in values}), dtype=torch.long)


def token_classes(tokenizer: Any) -> dict[str, torch.Tensor]:
    """Id sets per token class: each role the tokenizer has (``cls``, ``sep``, ``bos``,
    ``eos``), ``special`` (every special token, :func:`special_ids`) and ``punct``.

    Example:
        >>> classes = token_classes(tok)                # MiniLM's BERT tokenizer
        >>> sorted(classes)
        ['cls', 'punct', 'sep', 'special']
        >>> classes["cls"].tolist() == [tok.cls_token_id]
        True
        >>> tok.convert_tokens_to_ids(".") in classes["punct"].tolist()
        True
    """
    classes = {role: _id_tensor([i]) for role, i in _role_ids(tokenizer).items()}
    special = special_ids(tokenizer)
    classes["special"] = _id_tensor(special)
    punctuation = vocabulary_ids(tokenizer).punctuation
    classes["punct"] = punctuation[~torch.isin(punctuation, classes["special"])]
    return classes


# Texts whose tokens locate the template in the tokenizer's output (the first that gives a token).
TEMPLATE_TEXTS = ("a", "the", "x", "1")


def _first_row(ids: Any) -> list[int]:
    """``input_ids`` of one encoded text as a list (lists, nested lists or a ``[1, n]`` tensor)."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(i) for i in ids]


def special_template(tokenizer: Any) -> tuple[list[int], list[int]]:
    """``(prefix, suffix)``: the ids ``tokenizer(text)`` puts before and after the tokens of one
    text, e.g. ``([101], [102])`` for BERT's ``[CLS] … [SEP]``, ``([1], [])`` for LLaMA's
    ``<s> …``, ``([], [])`` for GPT-2.

    Found by encoding a short text both ways: its tokens alone (``tokenize`` then
    ``convert_tokens_to_ids``) and through ``tokenizer(text)``; the tokens are located in the
    latter. Raises InputError when no short text gives a token or the tokens are not there.
    """
    for text in TEMPLATE_TEXTS:
        try:
            plain = [int(i) for i in tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))]
            full = _first_row(tokenizer(text)["input_ids"])
        except (AttributeError, KeyError, TypeError, ValueError, InputError):
            continue
        if not plain:
            continue
        for start in range(len(full) - len(plain) + 1):
            if full[start:start + len(plain)] == plain:
                return full[:start], full[start + len(plain):]
    raise InputError(f"cannot tell which special tokens {type(tokenizer).__name__} adds around "
                     f"a text: none of {', '.join(map(repr, TEMPLATE_TEXTS))} gives its "
                     "tokens inside tokenizer(text)")


def has_pair_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer(a, b)`` encodes a sentence pair its own way: the special tokens
    of the pair are not those of two single texts back to back (BERT ``[CLS] a [SEP] b
    [SEP]``, RoBERTa ``<s> a </s></s> b </s>``). GPT-2 adds nothing to a pair (the halves are
    glued) and LLaMA repeats its single template (a second ``<s>``): no pair template.
    False too for a tokenizer that cannot encode pairs."""
    specials = special_ids(tokenizer)
    for text in TEMPLATE_TEXTS:
        try:
            single = _first_row(tokenizer(text)["input_ids"])
            pair = _first_row(tokenizer(text, text)["input_ids"])
        except (AttributeError, KeyError, TypeError, ValueError, InputError):
            return False
        if any(i not in specials for i in single):  # the text gave a token of its own
            around = [i for i in single if i in specials]
            return [i for i in pair if i in specials] != around + around
    return False


class TokenVocabulary:
    """A stand-in tokenizer built from token strings, for maps stored without one.

    Ids follow first appearance; special tokens and their roles are recognised by spelling
    (:func:`looks_special`, ``ROLE_SPELLINGS``); the unknown token is ``unk_token_id``.
    """

    def __init__(self, tokens: Iterable[str]) -> None:
        self._vocab = {tok: i for i, tok in enumerate(dict.fromkeys(tokens))}
        self.all_special_ids = [i for tok, i in self._vocab.items() if looks_special(tok)]
        for role, spellings in ROLE_SPELLINGS.items():
            found = [self._vocab[s] for s in spellings if s in self._vocab]
            setattr(self, f"{role}_token_id", found[0] if found else None)
        unknown = [self._vocab[s] for s in UNKNOWN_TOKENS if s in self._vocab]
        self.unk_token_id = unknown[0] if unknown else None

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
        return [self._vocab[t] for t in tokens]

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        names = {i: tok for tok, i in self._vocab.items()}
        return [names[int(i)] for i in ids]


# ------------------------------------------------------------------------- readable tokens
TOKEN_STYLES = ("byte_level", "metaspace", "wordpiece", "plain")
_SHOWN_SPACE = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍"}
_BYTE_TOKEN = re.compile(r"^<0x([0-9a-fA-F]{2})>$")


@functools.lru_cache(maxsize=1)
def byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable character -> byte (``Ġ`` is a space, ``Ċ`` a
    newline)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def token_style(tokenizer: Any) -> str:
    """The tokenizer's spelling style (:data:`TOKEN_STYLES`), from its decoder and
    pre-tokenizer (fast tokenizers) or the attributes of a slow one; ``plain`` otherwise."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    parts = " ".join(repr(getattr(backend, name, None)) for name in ("decoder", "pre_tokenizer")
                     ) if backend is not None else ""
    if "ByteLevel" in parts or hasattr(tokenizer, "byte_encoder"):
        return "byte_level"
    if "Metaspace" in parts or "▁" in parts or hasattr(tokenizer, "sp_model"):
        return "metaspace"
    if "WordPiece" in parts or hasattr(tokenizer, "wordpiece_tokenizer"):
        return "wordpiece"
    return "plain"


def guess_style(tokens: Iterable[str]) -> str:
    """The style of maps recorded without one, from the token strings' markers."""
    seen = "".join(tokens)
    if "Ġ" in seen or "Ċ" in seen:
        return "byte_level"
    if "▁" in seen:
        return "metaspace"
    return "plain"


def _visible(text: str) -> str:
    if text and not text.strip():
        return "".join(_SHOWN_SPACE.get(ch, "␣") for ch in text)
    return text


def _byte_level(token: str) -> str:
    table = byte_alphabet()
    if any(ch not in table for ch in token):  # an added token spelled in plain text
        return token
    raw = bytes(table[ch] for ch in token)
    # a character split over tokens shows its bytes (\xc3) rather than a wrong letter
    return codecs.decode(raw, "utf-8", errors="backslashreplace")


def _metaspace(token: str) -> str:
    found = _BYTE_TOKEN.match(token)
    if found and int(found.group(1), 16) < 0x80:
        return chr(int(found.group(1), 16))
    return token.replace("▁", " ")


_DECODERS = {"byte_level": _byte_level, "metaspace": _metaspace}


def readable_token(token: str, style: str) -> str:
    """One token as people read it (module docstring)."""
    if looks_special(token):
        return token
    decode = _DECODERS.get(style)
    return _visible(decode(token) if decode else token)


def readable(tokens: Iterable[str], style: str | None) -> list[str]:
    """Tokens as people read them; ``style`` ``None`` guesses it (:func:`guess_style`)."""
    tokens = list(tokens)
    if style is None:
        style = guess_style(tokens)
    if style not in TOKEN_STYLES:
        raise InputError(f"token style must be one of {', '.join(TOKEN_STYLES)}; got {style!r}")
    return [readable_token(t, style) for t in tokens]
