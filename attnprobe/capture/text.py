"""Text in, model inputs out: the one path every corpus analysis takes from strings to batches.

- A text with a tab is a **sentence pair** ``a<TAB>b``, encoded the tokenizer's way
  (``[CLS] a [SEP] b [SEP]`` for BERT); both halves must hold text.
- **Too long** texts follow ``truncation`` (:data:`TRUNCATIONS`): ``"error"`` (the default,
  also ``False``) names the first one, ``"cut"`` (also ``True``) cuts it the tokenizer's way
  (special tokens kept), ``"skip"`` leaves it out of the corpus and lists it.
- Batches are padded on the right, so every model numbers the real tokens from 0.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from attnprobe.core.display import counted, describe
from attnprobe.core.registry import one_of
from attnprobe.errors import InputError

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "MODEL_KEYS",
    "PAIR_KEYS",
    "TRUNCATIONS",
    "Corpus",
    "batch_spans",
    "check_texts",
    "encode",
    "max_length_of",
    "model_inputs",
    "model_keys",
    "prepare_corpus",
    "text_input",
    "token_lengths",
    "token_limit",
    "truncation_mode",
]

DEFAULT_BATCH_SIZE = 16  # texts per forward, the same default for every corpus analysis
Truncation = Literal["error", "cut", "skip"] | bool
TRUNCATIONS = ("error", "cut", "skip")
_HUGE = 1_000_000  # tokenizers report "no limit" as a huge sentinel


def truncation_mode(value: Truncation) -> str:
    """``"error"``, ``"cut"`` or ``"skip"`` (``False`` / ``True`` mean error / cut)."""
    if value is False:
        return "error"
    if value is True:
        return "cut"
    if value not in TRUNCATIONS:
        raise InputError(one_of("truncation", value, TRUNCATIONS))
    return value  # type: ignore[return-value]


def check_texts(texts: Sequence[str] | str) -> list[str]:
    """A non-empty list of non-empty strings; a sentence pair needs text on both sides."""
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    if not texts:
        raise InputError("no text given")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"text {i} is {type(text).__name__}, not str")
        if not text.strip():
            raise InputError(f"text {i} is empty")
        first, tab, second = text.partition("\t")
        if tab and (not first.strip() or not second.strip()):
            raise InputError(f"text {i} is a sentence pair (it has a tab) with an empty half")
    return texts


def text_input(text: str) -> str | tuple[str, str]:
    """What the tokenizer is given for one text: a pair for ``a<TAB>b``."""
    first, tab, second = text.partition("\t")
    return (first, second) if tab else text


def max_length_of(model: nn.Module, tokenizer: Any) -> int | None:
    """The most tokens the model accepts (tokenizer limit and position table), if known."""
    limits = [getattr(tokenizer, "model_max_length", None)]
    config = getattr(model, "config", None)
    limits.append(getattr(config, "max_position_embeddings", None))
    limits.append(getattr(config, "max_len", None))
    limits = [n for n in limits if isinstance(n, int) and 0 < n < _HUGE]
    return min(limits) if limits else None


def token_limit(model: nn.Module, tokenizer: Any, max_length: int | None) -> int | None:
    """The most tokens per text: the model's own limit (:func:`max_length_of`), lowered to
    ``max_length`` when given (checked: a positive int); ``None`` when unknown."""
    limit = max_length_of(model, tokenizer)
    if max_length is not None:
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise InputError(f"max_length must be a positive integer; got {max_length!r}")
        limit = min(limit, max_length) if limit else max_length
    return limit


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


def _tokenize(tokenizer: Any, texts: Sequence[str], padding_side: str,
              cut: dict[str, Any]) -> dict[str, torch.Tensor]:
    inputs = [text_input(t) for t in texts]
    if _is_hf_tokenizer(tokenizer):
        old_side = tokenizer.padding_side
        tokenizer.padding_side = padding_side
        try:
            pairs = [isinstance(x, tuple) for x in inputs]
            if any(pairs) and not all(pairs):  # pairs and single texts: encode, then pad
                single = [tokenizer(*x if isinstance(x, tuple) else (x,),
                                    **(cut or {"truncation": False})) for x in inputs]
                batch = tokenizer.pad([model_keys(e, pairs=True) for e in single],
                                      padding=True, return_tensors="pt")
            elif any(pairs):
                batch = tokenizer([x[0] for x in inputs], [x[1] for x in inputs],
                                  padding=True, return_tensors="pt",
                                  **(cut or {"truncation": False}))
            else:
                batch = tokenizer(inputs, padding=True, return_tensors="pt",
                                  **(cut or {"truncation": False}))
        finally:
            tokenizer.padding_side = old_side
        return model_keys(batch, pairs=any(pairs))
    if any(isinstance(x, tuple) for x in inputs):
        raise InputError(f"{type(tokenizer).__name__} cannot encode sentence pairs (texts with "
                         "a tab)")
    # length limits are checked by the caller, the same way for every tokenizer
    return dict(tokenizer(list(inputs), padding_side=padding_side,
                          **(cut or {"max_length": _HUGE})))


def encode(model: nn.Module, tokenizer: Any, texts: Sequence[str], *,
           max_length: int | None = None, truncation: Truncation = "error",
           padding_side: str = "right") -> dict[str, torch.Tensor]:
    """Tokenise a batch (module docstring); ``truncation="skip"`` is for :func:`prepare_corpus`
    and acts like ``"error"`` here.

    Returns ``input_ids`` and ``attention_mask`` ``[batch, seq]`` (1 = real token), and the
    tokenizer's ``token_type_ids`` when it gives them (sentence pairs).
    """
    if padding_side not in ("left", "right"):
        raise InputError(f"padding_side must be 'left' or 'right'; got {padding_side!r}")
    mode = truncation_mode(truncation)
    limit = token_limit(model, tokenizer, max_length)
    cut = {"truncation": True, "max_length": limit} if mode == "cut" and limit else {}
    batch = _tokenize(tokenizer, texts, padding_side, cut)
    lengths = batch["attention_mask"].sum(-1)
    if limit is not None and int(lengths.max()) > limit:
        i = int(lengths.argmax())
        if mode == "cut":  # the special tokens alone need more than the limit
            specials = getattr(tokenizer, "num_special_tokens_to_add", None)
            need = specials(pair="\t" in texts[i]) + 1 if callable(specials) else limit + 1
            raise InputError(f"text {i} cannot be cut to {limit} tokens: its special tokens "
                             f"and one word need at least {need}; raise --max-length")
        raise InputError(f"text {i} has {int(lengths[i])} tokens but the model takes at most "
                         f"{limit}; cut it (truncation='cut', CLI --truncate) or leave it out "
                         "(truncation='skip', CLI --skip-long)")
    return batch


def token_lengths(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Tokens of each text (special tokens included), without padding or cutting."""
    if _is_hf_tokenizer(tokenizer):
        found = tokenizer([text_input(t) for t in texts], truncation=False)["input_ids"]
        return [len(ids) for ids in found]
    batch = _tokenize(tokenizer, texts, "right", {})
    return [int(n) for n in batch["attention_mask"].sum(-1)]


@dataclass(frozen=True)
class Corpus:
    """The texts an analysis runs on, after ``truncation="skip"`` left the long ones out.

    ``ids`` are the texts' positions in the caller's list (as strings, the ``example_id`` of
    every table), ``skipped`` the ids left out.
    """

    texts: tuple[str, ...]
    ids: tuple[str, ...]
    skipped: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return describe("Corpus", counted(len(self.texts), "text"),
                        f"{counted(len(self.skipped), 'text')} skipped" if self.skipped else None)


def prepare_corpus(model: nn.Module, tokenizer: Any, texts: Sequence[str] | str, *,
                   truncation: Truncation = "error",
                   max_length: int | None = None) -> Corpus:
    """Check the texts before any forward: a too-long text is an error naming it
    (``"error"``), left out (``"skip"``) or left to be cut (``"cut"``)."""
    texts = check_texts(texts)
    mode = truncation_mode(truncation)
    ids = [str(i) for i in range(len(texts))]
    limit = token_limit(model, tokenizer, max_length)
    if mode == "cut" or limit is None:
        return Corpus(tuple(texts), tuple(ids))
    lengths = token_lengths(tokenizer, texts)
    long = [i for i, n in enumerate(lengths) if n > limit]
    if long and mode == "error":
        i = long[0]
        raise InputError(f"text {i} has {lengths[i]} tokens but the model takes at most "
                         f"{limit}; cut it (truncation='cut', CLI --truncate) or leave it out "
                         "(truncation='skip', CLI --skip-long)")
    if len(long) == len(texts):
        raise InputError(f"every text is longer than the model allows ({limit} tokens); "
                         "nothing is left after truncation='skip'")
    keep = [i for i in range(len(texts)) if i not in set(long)]
    return Corpus(tuple(texts[i] for i in keep), tuple(ids[i] for i in keep),
                  tuple(ids[i] for i in long))


def model_inputs(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A batch on the model's device; encoder-decoder models get the text on both sides, so
    decoder self- and cross-attention are captured too."""
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    if device.type == "meta":
        raise InputError("the model's weights are on the 'meta' device (not loaded); load or "
                         "materialise them before running it")
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
