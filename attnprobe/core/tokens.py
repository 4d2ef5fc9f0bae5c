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
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import torch

__all__ = [
    "SPECIAL_ROLES",
    "UNKNOWN_TOKENS",
    "TokenVocabulary",
    "is_punctuation",
    "looks_special",
    "special_ids",
    "special_tokens",
    "token_classes",
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


def _id_tensor(values: Iterable[int]) -> torch.Tensor:
    return torch.as_tensor(sorted({int(v) for v in values}), dtype=torch.long)


def token_classes(tokenizer: Any) -> dict[str, torch.Tensor]:
    """Id sets per token class: each role the tokenizer has (``cls``, ``sep``, ``bos``,
    ``eos``), ``special`` (every special token, :func:`special_ids`) and ``punct``."""
    classes = {role: _id_tensor([i]) for role, i in _role_ids(tokenizer).items()}
    special = special_ids(tokenizer)
    classes["special"] = _id_tensor(special)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    classes["punct"] = _id_tensor(i for tok, i in vocab.items()
                                  if is_punctuation(tok) and i not in special)
    return classes


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
