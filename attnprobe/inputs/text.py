"""Text in, model inputs out: the one path every corpus analysis takes from texts to batches.

- A text is a string or token ids (:mod:`attnprobe.inputs.token_ids`: lists of ids, a 2-D
  id tensor, a tokenizer output); ids are given to the model exactly as they are.
- A string with a tab is a **sentence pair** ``a<TAB>b``, encoded the tokenizer's way
  (``[CLS] a [SEP] b [SEP]`` for BERT), when the tokenizer has a pair template
  (:func:`pairs_of`); both halves must hold text. Without one (GPT-2, LLaMA) the tab stays in
  the text, as the tokenizer encodes it. A string that gives no
  token besides the tokenizer's special tokens (a zero-width space, a lone combining accent,
  control characters ...) is an error naming it.
- Every id is checked against the model's input embedding: a tokenizer larger than the
  model's vocabulary is an error naming the text and the id, not an index error in a forward.
- **Too long** texts follow ``truncation`` (:data:`TRUNCATIONS`): ``"error"`` (the default,
  also ``False``) names the first one, ``"cut"`` (also ``True``) cuts it the tokenizer's way
  (special tokens kept; ids keep their first tokens), ``"skip"`` leaves it out of the corpus
  and lists it.
- Texts are tokenised without padding and padded here, through the attention mask, with a
  filler id (:func:`filler_id`: the pad token, else eos, else unk, else 0): tokenizers work as
  they ship (no pad token, either ``padding_side``), and the caller's tokenizer is never
  changed (so threads may share it). Batches are padded on the right, so every model numbers
  the real tokens from 0 (generation pads on the left).
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnprobe.core.corpus_options import (
    DEFAULT_BATCH_SIZE,
    TRUNCATIONS,
    Truncation,
    truncation_mode,
)
from attnprobe.core.display import counted, describe
from attnprobe.core.residence import input_device
from attnprobe.core.tokens import has_pair_template, special_ids
from attnprobe.errors import InputError
from attnprobe.inputs.length_limit import NO_LIMIT, max_length_of, token_limit
from attnprobe.inputs.token_ids import Text, TokenIds, check_inputs, input_vocab_size

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "MODEL_KEYS",
    "PAIR_KEYS",
    "TRUNCATIONS",
    "Corpus",
    "Text",
    "TokenIds",
    "TokenRow",
    "batch_spans",
    "check_inputs",
    "check_texts",
    "encode",
    "filler_id",
    "max_length_of",
    "model_inputs",
    "model_keys",
    "pad_ids",
    "pad_rows",
    "pairs_of",
    "prepare_corpus",
    "text_input",
    "token_lengths",
    "token_limit",
    "token_rows",
    "truncation_mode",
]

def check_texts(texts: Sequence[str] | str) -> list[str]:
    """A non-empty list of non-empty strings (a sentence pair needs text on both sides), for
    analyses that need the words themselves (syntax, parsing); token ids are refused."""
    found = check_inputs(texts)
    ids = next((i for i, t in enumerate(found) if not isinstance(t, str)), None)
    if ids is not None:
        raise InputError(f"text {ids} is token ids; this analysis needs the text itself "
                         "(strings)")
    return found  # type: ignore[return-value]


def text_input(text: str) -> str | tuple[str, str]:
    """What the tokenizer is given for one text: a pair for ``a<TAB>b``."""
    first, tab, second = text.partition("\t")
    return (first, second) if tab else text


def pairs_of(tokenizer: Any, texts: Sequence[Any]) -> bool:
    """Whether the tabs of ``texts`` make sentence pairs: only for a tokenizer with a pair
    template (:func:`~attnprobe.core.tokens.has_pair_template`). Without one a pair is two
    texts glued together (GPT-2: the tab is lost) or two single templates (LLaMA: a second
    ``<s>``), so the tab stays part of the text."""
    return any(isinstance(t, str) and "\t" in t for t in texts) \
        and has_pair_template(tokenizer)


# What a tokenizer's output gives the model. Segment ids keep the halves of a sentence pair
# apart (BERT's token_type_ids); single texts go without them, so a model never sees segment
# ids it was not given before (e.g. GPT-2 adds a token_type_ids embedding when given one).
MODEL_KEYS = ("input_ids", "attention_mask")
PAIR_KEYS = (*MODEL_KEYS, "token_type_ids")


def model_keys(encoded: Any, *, pairs: bool = False) -> dict[str, Any]:
    """The entries of a tokenizer's output that go to the model (:data:`MODEL_KEYS`, and
    :data:`PAIR_KEYS` for sentence pairs)."""
    return {k: encoded[k] for k in (PAIR_KEYS if pairs else MODEL_KEYS) if k in encoded}


def _is_hf_tokenizer(tokenizer: Any) -> bool:
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(tokenizer, transformers.PreTrainedTokenizerBase)


@dataclass(frozen=True)
class TokenRow:
    """One text's ids before padding, and its segment ids when it is a sentence pair."""

    ids: list[int]
    types: list[int] | None = None


def _hf_rows(tokenizer: Any, texts: Sequence[str], cut: dict[str, Any]) -> list[TokenRow]:
    """Single texts and sentence pairs, each encoded alone the tokenizer's way, unpadded; a
    tab is kept as text for a tokenizer without a pair template (:func:`pairs_of`)."""
    split = pairs_of(tokenizer, texts)
    inputs = [text_input(t) if split else t for t in texts]
    options = cut or {"truncation": False}
    rows: list[TokenRow] = [TokenRow([])] * len(inputs)
    single = [i for i, x in enumerate(inputs) if isinstance(x, str)]
    pairs = [i for i, x in enumerate(inputs) if isinstance(x, tuple)]
    if single:
        found = tokenizer([inputs[i] for i in single], **options)["input_ids"]
        for i, ids in zip(single, found, strict=True):
            rows[i] = TokenRow([int(t) for t in ids])
    if pairs:
        found = tokenizer([inputs[i][0] for i in pairs], [inputs[i][1] for i in pairs],
                          **options)
        types = found.get("token_type_ids")
        for k, i in enumerate(pairs):
            rows[i] = TokenRow([int(t) for t in found["input_ids"][k]],
                           None if types is None else [int(t) for t in types[k]])
    return rows


def _other_rows(tokenizer: Any, texts: Sequence[str], cut: dict[str, Any]) -> list[TokenRow]:
    """A tokenizer of attnprobe's protocol (e.g. the reference models' ``WordTokenizer``):
    called on the batch, each row stripped of its padding by the mask."""
    if any("\t" in t for t in texts):
        raise InputError(f"{type(tokenizer).__name__} cannot encode sentence pairs (texts with "
                         "a tab)")
    # length limits are checked by the caller, the same way for every tokenizer
    batch = tokenizer(list(texts), padding_side="right", **(cut or {"max_length": NO_LIMIT}))
    ids = torch.as_tensor(batch["input_ids"]).tolist()
    mask = torch.as_tensor(batch["attention_mask"]).tolist() if "attention_mask" in batch \
        else [[1] * len(row) for row in ids]
    return [TokenRow([int(t) for t, real in zip(row, keep, strict=True) if real])
            for row, keep in zip(ids, mask, strict=True)]


def _shown(text: str) -> str:
    """``text`` quoted, cut to 40 characters, invisible characters (controls, format
    characters, lone combining marks, odd spaces) written as escapes."""
    text = text if len(text) <= 40 else text[:37] + "..."
    return "'" + "".join(
        ch if ch == " " or unicodedata.category(ch)[0] not in "CMZ" else
        f"\\u{ord(ch):04x}" if ord(ch) > 0xFF else f"\\x{ord(ch):02x}" for ch in text) + "'"


def _no_token(i: int, text: str, tokenizer: Any, ids: list[int]) -> str:
    shown = _shown(text)
    tokens = " ".join(map(str, tokenizer.convert_ids_to_tokens(ids))) if ids else "nothing"
    return (f"text {i} ({shown}) gives no token besides the tokenizer's special tokens "
            f"({tokens}); there is nothing of it to analyse")


def _rows(tokenizer: Any, items: Sequence[Text], cut_to: int | None, start: int = 0
          ) -> list[TokenRow]:
    """Each text's ids (strings through the tokenizer, ids as given; cut to ``cut_to`` tokens
    when given), every string checked to give a token besides special tokens. ``start`` is
    the first text's index in the caller's list (for messages)."""
    rows: list[TokenRow] = [TokenRow(list(t.ids[:cut_to] if cut_to else t.ids))
                        if isinstance(t, TokenIds) else TokenRow([]) for t in items]
    strings = [i for i, t in enumerate(items) if isinstance(t, str)]
    if not strings:
        return rows
    if tokenizer is None:
        raise InputError("texts need a tokenizer; pass the model's tokenizer (or give token "
                         "ids)")
    cut = {"truncation": True, "max_length": cut_to} if cut_to else {}
    encoded = (_hf_rows if _is_hf_tokenizer(tokenizer) else _other_rows)(
        tokenizer, [items[i] for i in strings], cut)  # type: ignore[misc]
    specials = special_ids(tokenizer)
    for i, row in zip(strings, encoded, strict=True):
        if all(t in specials for t in row.ids):
            raise InputError(_no_token(start + i, items[i], tokenizer,  # type: ignore[arg-type]
                                       row.ids))
        rows[i] = row
    return rows


def _check_vocab(rows: Sequence[TokenRow], items: Sequence[Text], vocab: int | None,
                 tokenizer: Any, start: int = 0) -> None:
    """Every id below ``vocab`` (the model's input embedding rows), else an error naming the
    text and the id."""
    if vocab is None:
        return
    for i, (row, item) in enumerate(zip(rows, items, strict=True)):
        if not row.ids or max(row.ids) < vocab:
            continue
        bad = next(t for t in row.ids if t >= vocab)
        if isinstance(item, TokenIds):
            raise InputError(f"text {start + i} holds token id {bad}, outside the model's "
                             f"vocabulary (ids 0..{vocab - 1})")
        token = tokenizer.convert_ids_to_tokens([bad])
        raise InputError(f"text {start + i} gives token id {bad} ({token[0]!r}) but the model "
                         f"has {vocab} input embeddings (ids 0..{vocab - 1}): the tokenizer "
                         "does not belong to this model")


def filler_id(tokenizer: Any, vocab: int | None = None) -> int:
    """The id put under padding, where the attention mask hides it: the tokenizer's pad
    token, else eos, else unk, else 0 (the first of them below ``vocab``)."""
    for name in ("pad_token_id", "eos_token_id", "unk_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
                and (vocab is None or value < vocab):
            return value
    return 0


def _pad(rows: Sequence[TokenRow], filler: int, side: str, type_pad: int
         ) -> dict[str, torch.Tensor]:
    """``input_ids`` / ``attention_mask`` (and ``token_type_ids`` when a row has them)
    ``[batch, seq]``, each row's ids on the ``side`` its padding is not."""
    width = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), width), filler, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    types = torch.full_like(ids, type_pad) if any(r.types is not None for r in rows) else None
    for b, row in enumerate(rows):
        n = len(row.ids)
        span = slice(0, n) if side == "right" else slice(width - n, width)
        ids[b, span] = torch.tensor(row.ids, dtype=torch.long)
        mask[b, span] = 1
        if types is not None:
            types[b, span] = torch.tensor(row.types or [0] * n, dtype=torch.long)
    batch = {"input_ids": ids, "attention_mask": mask}
    if types is not None:
        batch["token_type_ids"] = types
    return batch


def encode(model: nn.Module, tokenizer: Any, texts: Sequence[Text] | Any, *,
           max_length: int | None = None, truncation: Truncation = "error",
           padding_side: str = "right") -> dict[str, torch.Tensor]:
    """Tokenise and pad a batch (module docstring); ``truncation="skip"`` is for
    :func:`prepare_corpus` and acts like ``"error"`` here.

    Returns ``input_ids`` and ``attention_mask`` ``[batch, seq]`` (1 = real token), and the
    tokenizer's ``token_type_ids`` when it gives them (sentence pairs).
    """
    if padding_side not in ("left", "right"):
        raise InputError(f"padding_side must be 'left' or 'right'; got {padding_side!r}")
    mode = truncation_mode(truncation)
    items = check_inputs(texts)
    limit = token_limit(model, tokenizer, max_length)
    rows = _rows(tokenizer, items, limit if mode == "cut" else None)
    vocab = input_vocab_size(model)
    _check_vocab(rows, items, vocab, tokenizer)
    lengths = [len(r.ids) for r in rows]
    if limit is not None and max(lengths) > limit:
        i = lengths.index(max(lengths))
        if mode == "cut":  # the special tokens alone need more than the limit
            specials = getattr(tokenizer, "num_special_tokens_to_add", None)
            pair = pairs_of(tokenizer, [items[i]])
            need = specials(pair=pair) + 1 if callable(specials) else limit + 1
            raise InputError(f"text {i} cannot be cut to {limit} tokens: its special tokens "
                             f"and one word need at least {need}; raise --max-length")
        raise InputError(f"text {i} has {lengths[i]} tokens but the model takes at most "
                         f"{limit}; cut it (truncation='cut', CLI --truncate) or leave it out "
                         "(truncation='skip', CLI --skip-long)")
    return _pad(rows, filler_id(tokenizer, vocab), padding_side,
                int(getattr(tokenizer, "pad_token_type_id", 0) or 0))


def pad_ids(model: nn.Module, tokenizer: Any, rows: Sequence[Sequence[int]], *,
            padding_side: str = "right") -> dict[str, torch.Tensor]:
    """Already tokenised rows (e.g. pre-split words) padded as :func:`encode` pads them:
    ``input_ids`` / ``attention_mask`` ``[batch, seq]``."""
    return _pad([TokenRow([int(t) for t in row]) for row in rows],
                filler_id(tokenizer, input_vocab_size(model)), padding_side, 0)


def token_rows(tokenizer: Any, texts: Sequence[Text] | Any, *,
               model: nn.Module | None = None) -> list[TokenRow]:
    """Each text's tokens (special tokens included), without padding or cutting, to pad
    later with :func:`pad_rows` (a text tokenized once); each string checked to give a
    token besides special tokens and, with ``model``, every id against its input
    embedding."""
    items = check_inputs(texts)
    rows = _rows(tokenizer, items, None)
    if model is not None:
        _check_vocab(rows, items, input_vocab_size(model), tokenizer)
    return rows


def pad_rows(model: nn.Module, tokenizer: Any, rows: Sequence[TokenRow], *,
             padding_side: str = "right") -> dict[str, torch.Tensor]:
    """Rows of :func:`token_rows` padded as :func:`encode` pads them (segment ids too)."""
    return _pad(rows, filler_id(tokenizer, input_vocab_size(model)), padding_side,
                int(getattr(tokenizer, "pad_token_type_id", 0) or 0))


def token_lengths(tokenizer: Any, texts: Sequence[Text] | Any, *,
                  model: nn.Module | None = None) -> list[int]:
    """Tokens of each text, checked (:func:`token_rows`)."""
    return [len(r.ids) for r in token_rows(tokenizer, texts, model=model)]


@dataclass(frozen=True)
class Corpus:
    """The texts an analysis runs on, after ``truncation="skip"`` left the long ones out.

    ``texts`` are strings and :class:`TokenIds`, checked (every string gives a token besides
    special tokens, every id fits the model); ``ids`` are their positions in the caller's list
    (as strings, the ``example_id`` of every table), ``skipped`` the ids left out.
    """

    texts: tuple[Text, ...]
    ids: tuple[str, ...]
    skipped: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return describe("Corpus", counted(len(self.texts), "text"),
                        f"{counted(len(self.skipped), 'text')} skipped" if self.skipped else None)


def prepare_corpus(model: nn.Module, tokenizer: Any, texts: Sequence[Text] | Any, *,
                   truncation: Truncation = "error",
                   max_length: int | None = None) -> Corpus:
    """Check the texts before any forward (:func:`check_inputs`, :func:`token_lengths`): a
    too-long text is an error naming it (``"error"``), left out (``"skip"``) or left to be
    cut (``"cut"``)."""
    items = check_inputs(texts)
    mode = truncation_mode(truncation)
    ids = [str(i) for i in range(len(items))]
    limit = token_limit(model, tokenizer, max_length)
    lengths = token_lengths(tokenizer, items, model=model)
    if mode == "cut" or limit is None:
        return Corpus(tuple(items), tuple(ids))
    long = [i for i, n in enumerate(lengths) if n > limit]
    if long and mode == "error":
        i = long[0]
        raise InputError(f"text {i} has {lengths[i]} tokens but the model takes at most "
                         f"{limit}; cut it (truncation='cut', CLI --truncate) or leave it out "
                         "(truncation='skip', CLI --skip-long)")
    if len(long) == len(items):
        raise InputError(f"every text is longer than the model allows ({limit} tokens); "
                         "nothing is left after truncation='skip'")
    out = set(long)
    keep = [i for i in range(len(items)) if i not in out]
    return Corpus(tuple(items[i] for i in keep), tuple(ids[i] for i in keep),
                  tuple(ids[i] for i in long))


def model_inputs(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A batch on the model's device; encoder-decoder models get the text on both sides, so
    decoder self- and cross-attention are captured too."""
    device = input_device(model)
    inputs = {k: v.to(device) for k, v in batch.items()}
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = inputs["input_ids"]
        inputs["decoder_attention_mask"] = inputs["attention_mask"]
    return inputs


def batch_spans(n: int, size: int) -> list[slice]:
    """``[0:size], [size:2·size], ...`` over ``n`` items."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InputError(f"batch_size must be a positive integer; got {size!r}")
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]
