"""How a metric spec names its tokens: the one rule every command and API resolves them by.

A name in a spec (``logit:T``, ``prob:T``, ``logprob:T``, ``logit_diff:A,B``,
``next-token:T``) is resolved in this order:

1. an id: an int, or digits (``464``);
2. the name **as the model reads it mid-sentence**: the text after the colon is split on
   commas and each name stripped of surrounding whitespace, then tokenized after a word and a
   space. Tokenizers that mark a word start read it with that mark (byte-level BPE ``Paris``
   → ``ĠParis``, SentencePiece → ``▁Paris``); the others read it as written (WordPiece ``cat``
   → ``cat``, the reference word tokenizer ``t55`` → ``t55``). One token is the answer;
3. an exact vocabulary string (``Ġc``, ``##at``, ``t55``), for tokens no mid-sentence word
   gives (a word's first piece without its space mark: give it as its id or vocabulary
   string);
4. anything else is a one-line error naming the pieces the name tokenizes to.

This is the form literature specs are written in: ``logit_diff:Paris,Rome`` means the words
" Paris" and " Rome" as they follow other words. :class:`Resolved` keeps the vocabulary
string and the id of each resolved token, which the tables record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnprobe.errors import InputError

__all__ = ["Resolved", "mid_sentence_pieces", "resolve_token", "token_id"]

# a word every tokenizer splits off on its own, so the name after it is read mid-sentence
_CONTEXT = "a"


@dataclass(frozen=True)
class Resolved:
    """One token of a metric: ``name`` as written, ``token`` its vocabulary string (``None``
    when it was given as an id), ``id``."""

    name: str
    token: str | None
    id: int

    @property
    def shown(self) -> str:
        """How a spec shows it: the vocabulary string, else the id."""
        return self.token if self.token is not None else str(self.id)


def _pieces(tokenizer: Any, text: str) -> list[str] | None:
    """The tokens of ``text`` without special tokens, or None for a tokenizer that cannot
    tell (no ``tokenize``)."""
    tokenize = getattr(tokenizer, "tokenize", None)
    if not callable(tokenize):
        return None
    try:
        return [str(t) for t in tokenize(text)]
    except (InputError, TypeError, ValueError):
        return None


def mid_sentence_pieces(name: str, tokenizer: Any) -> list[str] | None:
    """The tokens of ``name`` as the model reads it after a word and a space (module
    docstring); None when the tokenizer has no ``tokenize``.

    Example:
        >>> mid_sentence_pieces("t55", lm_tok)
        ['t55']
    """
    context = _pieces(tokenizer, _CONTEXT)
    both = _pieces(tokenizer, f"{_CONTEXT} {name}")
    if context is not None and both is not None and both[:len(context)] == context:
        return both[len(context):]
    return _pieces(tokenizer, f" {name}")  # the context merged with the name: no context


def _vocab(tokenizer: Any) -> dict[str, int]:
    get = getattr(tokenizer, "get_vocab", None)
    found = get() if callable(get) else None
    return found if isinstance(found, dict) else {}


def _id_of(tokenizer: Any, token: str, vocab: dict[str, int]) -> int | None:
    if token in vocab:
        return int(vocab[token])
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    found = convert(token) if callable(convert) else None
    return int(found) if isinstance(found, int) else None


def _is_unknown(tokenizer: Any, name: str, token_id: int) -> bool:
    """Whether ``name`` was read as the unknown token (and is not its name)."""
    return token_id == getattr(tokenizer, "unk_token_id", None) \
        and name != getattr(tokenizer, "unk_token", None)


def resolve_token(name: str | int, tokenizer: Any, spec: str) -> Resolved:
    """The token ``name`` names in metric ``spec`` (module docstring).

    Raises:
        InputError: a name without a tokenizer, a name that is several tokens mid-sentence
            and no vocabulary string (its pieces are named), an unknown word.

    Example:
        >>> found = resolve_token(" t55 ", lm_tok, "logit:t55")
        >>> (found.token, found.id == lm_tok.get_vocab()["t55"])
        ('t55', True)
    """
    if isinstance(name, int) and not isinstance(name, bool):
        return Resolved(str(name), None, name)
    text = str(name).strip()
    if text.lstrip("-").isdigit():
        return Resolved(text, None, int(text))
    if tokenizer is None:
        raise InputError(f"metric {spec} names the token {text!r}; pass a tokenizer or an id")
    vocab = _vocab(tokenizer)
    pieces = mid_sentence_pieces(text, tokenizer)
    if pieces is not None and len(pieces) == 1:
        found = _id_of(tokenizer, pieces[0], vocab)
        if found is not None and not _is_unknown(tokenizer, text, found):
            return Resolved(text, pieces[0], found)
    if text in vocab:
        return Resolved(text, text, int(vocab[text]))
    if pieces is None or len(pieces) == 1:
        raise InputError(f"metric {spec}: {text!r} is not in the tokenizer's vocabulary; name "
                         "one token (a word, its vocabulary string or its id)")
    shown = ", ".join(repr(p) for p in pieces)
    raise InputError(f"metric {spec}: {text!r} is {len(pieces)} tokens, not one, as the "
                     f"model reads it mid-sentence ({shown}); name one token (a word, its "
                     "vocabulary string or its id)")


def token_id(token: str | int, tokenizer: Any, spec: str) -> int:
    """The id of one token given as an id or a name (:func:`resolve_token`).

    Example:
        >>> token_id("t05", lm_tok, "logit:t05") == lm_tok.get_vocab()["t05"]
        True
        >>> token_id("464", None, "logit:464")          # an id needs no tokenizer
        464
    """
    return resolve_token(token, tokenizer, spec).id

